//! The admin service in actix-web: [`Admin::actix_scope`].

use actix_web::{HttpRequest, HttpResponse, web};

use crate::admin::Admin;
use crate::handle::{AdminRequest, MAX_BODY};

impl Admin {
    /// A scope at the mount path ([`AdminBuilder::mount_path`](crate::AdminBuilder::mount_path),
    /// `/admin` by default) serving every admin route:
    /// `App::new().service(admin.actix_scope())`.
    #[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
    pub fn actix_scope(&self) -> actix_web::Scope {
        let admin = self.clone();
        web::scope(&self.inner.mount)
            .app_data(web::PayloadConfig::new(MAX_BODY))
            .default_service(web::to(move |request: HttpRequest, body: web::Bytes| {
                let admin = admin.clone();
                async move { admin.answer_actix(&request, &body).await }
            }))
    }

    async fn answer_actix(&self, request: &HttpRequest, body: &[u8]) -> HttpResponse {
        let header = |name: &str| request.headers().get(name).and_then(|v| v.to_str().ok());
        let mount = self.inner.mount.as_str();
        let path = request.path();
        let path = path.strip_prefix(mount).unwrap_or(path);
        let query = request.query_string();
        let answer = self
            .handle(
                AdminRequest::new(request.method().as_str(), path)
                    .query((!query.is_empty()).then_some(query))
                    .authorization(header("authorization"))
                    .body(header("content-type"), body),
            )
            .await;
        let status = actix_web::http::StatusCode::from_u16(answer.status().as_u16())
            .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = HttpResponse::build(status);
        for (name, value) in answer.headers() {
            response.insert_header((name.as_str(), value.as_bytes()));
        }
        response.body(answer.into_body())
    }
}
