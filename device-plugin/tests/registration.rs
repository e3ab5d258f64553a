//! Registering with a kubelet that refuses or does not answer: the test
//! kubelet stands in for the real one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use kubelet_proto::v1beta1::KUBELET_SOCKET;
use macvtap_deviceplugin::config::ResourceConfig;
use macvtap_deviceplugin::kubelet::register::register;
use std::time::Duration;
use test_kubelet::TestKubelet;

const WAIT: Duration = Duration::from_secs(5);

/// A kubelet's refusal reads as the kubelet's own words after what was
/// being done; a hung kubelet's as the wait and the cause.
#[tokio::test]
async fn a_refused_or_unanswered_registration_names_the_resource() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = TestKubelet::start(dir.path()).await.unwrap();
    let sock = dir.path().join(KUBELET_SOCKET);
    let bad = ResourceConfig::for_nic("bad name");
    let e = register(&sock, &bad, WAIT).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "registering macvtap.network.kubevirt.io/bad name with the kubelet: the ResourceName \
         \"macvtap.network.kubevirt.io/bad name\" is invalid"
    );
    kubelet.hang_register(true);
    let e = register(
        &sock,
        &ResourceConfig::for_nic("eth0"),
        Duration::from_millis(200),
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "registering macvtap.network.kubevirt.io/eth0 with the kubelet: deadline expired \
         before operation could complete: no answer within 200 ms; the kubelet is \
         overloaded or hung"
    );
    kubelet.hang_register(false);
    kubelet.stop().await;
}
