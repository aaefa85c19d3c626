//! The proxy's side towards the model APIs: the pooled client ([`Client`]), the
//! Responses answers kept for requests that continue one by id ([`ResponseChain`]), and
//! the webhooks posted through the same client ([`post_all`]).

mod client;
mod response_chain;
mod webhook;

pub use client::{
    thread_client, use_thread_client, BodyError, Client, Error, Outgoing, ResponseBody,
};
pub use response_chain::{
    missing, read_http, read_http_or_stored, Found, HttpRequest, Link, PendingAnswer,
    ResponseChain, HTTP_ANSWERS, HTTP_MAX_BYTES,
};
pub use webhook::post_all;
