// The pause program of the sandbox image hack/cluster.sh builds and imports
// (no registry): it holds a pod's namespaces, reaps orphaned children and
// exits on SIGINT or SIGTERM, as Kubernetes' build/pause/linux/pause.c does.
// Standard library only, so there is no go.sum.
module macvtap-rs.invalid/cluster/pause

go 1.26.0
