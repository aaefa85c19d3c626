//! The one place a webhook is posted: held requests (`crate::proxy::forward::held`) and alerts
//! (`crate::intervene::alerts`). Each URL in its own task with its own timeout, with the
//! proxy's own HTTP client, so that a slow or failing hook never delays a request or the
//! other hooks; failures are logged, and told to `done` (counted in `/metrics`).

use std::time::Duration;

use bytes::Bytes;

use super::client as upstream;

/// Posts `body` (JSON) to each of `urls`; `done(delivered)` is called once per URL.
/// `what` names the hook in the process log.
pub fn post_all(
    client: &upstream::Client,
    urls: &[String],
    body: &serde_json::Value,
    timeout: Duration,
    what: &'static str,
    done: impl Fn(bool) + Clone + Send + 'static,
) {
    let body = Bytes::from(body.to_string());
    for url in urls {
        let (client, body, url, done) = (client.clone(), body.clone(), url.clone(), done.clone());
        crate::spawn::task(what, async move {
            let delivered = post(&client, &url, body, timeout, what).await;
            done(delivered);
        });
    }
}

/// One POST; whether the hook took it (a 2xx answer in time).
async fn post(
    client: &upstream::Client,
    url: &str,
    body: Bytes,
    timeout: Duration,
    what: &'static str,
) -> bool {
    let Ok(uri) = url.parse::<http::Uri>() else {
        crate::warn_per_request!(%url, what, "webhook is not a URL");
        return false;
    };
    match tokio::time::timeout(timeout, client.post_json(&uri, body)).await {
        Ok(Ok(status)) if status.is_success() => true,
        Ok(Ok(status)) => {
            crate::warn_per_request!(%url, what, status = status.as_u16(), "webhook refused");
            false
        }
        Ok(Err(e)) => {
            crate::warn_per_request!(%url, what, error = %e, "webhook failed");
            false
        }
        Err(_) => {
            crate::warn_per_request!(%url, what, "webhook timed out");
            false
        }
    }
}
