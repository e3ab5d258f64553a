//! Two gRPC services on one socket, without a router framework: a request
//! goes to the first service when its path names that service
//! (`/<package>.<Service>/<Method>`), else to the second, whose generated
//! server answers `UNIMPLEMENTED` for a method it does not have.

use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

/// Services `A` and `B` served as one.
#[derive(Debug, Clone)]
pub struct Pair<A, B> {
    first: A,
    second: B,
}

impl<A: NamedService, B> Pair<A, B> {
    /// Serves `first` for the paths it names and `second` for the rest.
    pub fn new(first: A, second: B) -> Self {
        Self { first, second }
    }

    /// Whether `path` names a method of the first service.
    fn is_first(path: &str) -> bool {
        path.strip_prefix('/')
            .and_then(|p| p.strip_prefix(A::NAME))
            .is_some_and(|rest| rest.starts_with('/'))
    }
}

impl<A, B> Service<http::Request<Body>> for Pair<A, B>
where
    A: NamedService
        + Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    A::Future: Send + 'static,
    B: Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    B::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Generated tonic servers are always ready; each call below takes
        // a fresh clone, as tonic's own router does.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if Self::is_first(req.uri().path()) {
            let mut a = self.first.clone();
            Box::pin(async move { a.call(req).await })
        } else {
            let mut b = self.second.clone();
            Box::pin(async move { b.call(req).await })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct Named;
    impl NamedService for Named {
        const NAME: &'static str = "v1.DRAResourceHealth";
    }

    #[test]
    fn a_path_goes_to_the_service_it_names() {
        type P = Pair<Named, ()>;
        assert!(P::is_first("/v1.DRAResourceHealth/NodeWatchResources"));
        assert!(!P::is_first("/v1.DRAResourceHealthX/NodeWatchResources"));
        assert!(!P::is_first(
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources"
        ));
        assert!(!P::is_first("v1.DRAResourceHealth/NodeWatchResources"));
        assert!(!P::is_first("/"));
    }
}
