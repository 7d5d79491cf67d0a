//! [`AdminService`]: the admin service as a tower `Service` (axum, hyper, tonic).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};

use crate::admin::Admin;
use crate::handle::{AdminRequest, MAX_BODY};

/// The [`Admin`] service for tower stacks. In axum:
/// `Router::new().nest_service("/admin", AdminService::new(admin))` (the mount path is
/// [`AdminBuilder::mount_path`](crate::AdminBuilder::mount_path), `/admin` by default).
/// Paths are taken below the mount path, whether the router strips it (axum's
/// `nest_service`) or not.
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
#[derive(Clone, Debug)]
pub struct AdminService {
    admin: Admin,
}

impl AdminService {
    /// Serves `admin`.
    pub fn new(admin: Admin) -> Self {
        Self { admin }
    }
}

impl<B> tower_service::Service<Request<B>> for AdminService
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let admin = self.admin.clone();
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let body = match Limited::new(body, MAX_BODY).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(_) => {
                    let mut response = Response::new(Full::new(Bytes::from_static(
                        b"request body too large or unreadable",
                    )));
                    *response.status_mut() = StatusCode::PAYLOAD_TOO_LARGE;
                    return Ok(response);
                }
            };
            let header =
                |name: header::HeaderName| parts.headers.get(name).and_then(|v| v.to_str().ok());
            let path = parts.uri.path();
            let mount = admin.inner.mount.as_str();
            let path = match path.strip_prefix(mount) {
                Some(rest) if !mount.is_empty() && (rest.is_empty() || rest.starts_with('/')) => {
                    rest
                }
                _ => path,
            };
            let answer = admin
                .handle(
                    AdminRequest::new(parts.method.as_str(), path)
                        .query(parts.uri.query())
                        .authorization(header(header::AUTHORIZATION))
                        .body(header(header::CONTENT_TYPE), &body),
                )
                .await;
            Ok(answer.map(Full::new))
        })
    }
}
