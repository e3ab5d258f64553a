// kubevirt/macvtap-cni v0.13.1, the Go project we replace: its `cni` and
// `deviceplugin` commands, for the parity test, the upgrade e2e and the
// side-by-side benchmarks. Its own go.mod has `replace` directives, which
// `go install` refuses and which do not apply to a module that requires
// it, so this wrapper repeats them. Its `go` line is the release's own (it
// sets the binary's GODEBUG defaults).
//
// There is no go.sum: on 2026-12-01 the Go module proxy answered every
// request for github.com/kubevirt/macvtap-cni (the version list, v0.13.2,
// v0.13.1, v0.13.0, v0.12.0) with "403 Forbidden: This module version is
// not available". The builder says so, and the tests that need it are
// #[ignore]d naming the module (README.md, "Development"). When the proxy
// serves it: run `GOTOOLCHAIN=local go mod tidy` here, commit go.sum, and
// remove those #[ignore]s.
module macvtap-rs.invalid/peers/macvtap-cni-v0.13.1

go 1.20

tool (
	github.com/kubevirt/macvtap-cni/cmd/cni
	github.com/kubevirt/macvtap-cni/cmd/deviceplugin
)

require github.com/kubevirt/macvtap-cni v0.13.1

// The replace directives of github.com/kubevirt/macvtap-cni's own go.mod ("Pinned to kubernetes-1.26").
replace (
	k8s.io/api => k8s.io/api v0.26.4
	k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.26.4
	k8s.io/apimachinery => k8s.io/apimachinery v0.26.4
	k8s.io/apiserver => k8s.io/apiserver v0.26.4
	k8s.io/cli-runtime => k8s.io/cli-runtime v0.26.4
	k8s.io/client-go => k8s.io/client-go v0.26.4
	k8s.io/cloud-provider => k8s.io/cloud-provider v0.26.4
	k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.26.4
	k8s.io/code-generator => k8s.io/code-generator v0.26.4
	k8s.io/component-base => k8s.io/component-base v0.26.4
	k8s.io/cri-api => k8s.io/cri-api v0.26.4
	k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.26.4
	k8s.io/kube-aggregator => k8s.io/kube-aggregator v0.26.4
	k8s.io/kube-controller-manager => k8s.io/kube-controller-manager v0.26.4
	k8s.io/kube-proxy => k8s.io/kube-proxy v0.19.1
	k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.19.1
	k8s.io/kubelet => k8s.io/kubelet v0.26.4
	k8s.io/legacy-cloud-providers => k8s.io/legacy-cloud-providers v0.26.4
	k8s.io/metrics => k8s.io/metrics v0.26.4
	k8s.io/sample-apiserver => k8s.io/sample-apiserver v0.19.1
	vbom.ml/util => github.com/fvbommel/util v0.0.0-20180919145318-efcd4e0f9787
)
