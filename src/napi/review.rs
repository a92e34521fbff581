//! A network review dialog as the proxy calls it: the request it shows
//! and the JavaScript function that answers (the bash tool's per command,
//! the python tool's per call).

use std::sync::Arc;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::ThreadsafeFunction;
use napi_derive::napi;

/// What a network review dialog shows: the canonical destination, the
/// Unicode form of an `xn--` name, and whether that form mixes scripts or
/// imitates Latin letters.
#[napi(object)]
pub struct NetworkReviewRequest {
    /// `host:port`, canonical (IPv6 in brackets).
    pub authority: String,
    pub host: String,
    pub port: u32,
    pub unicode: Option<String>,
    pub mixed_scripts: bool,
}

/// Opens the dialog; resolves `once`, `command`, `session` or `deny`
/// (anything else, or a rejection, is a cancelled dialog).
pub type ReviewFn<const WEAK: bool = false> =
    ThreadsafeFunction<NetworkReviewRequest, Promise<String>, NetworkReviewRequest, Status, false, WEAK>;

/// The dialog as the proxy's review calls it.
pub fn asker<const WEAK: bool>(f: ReviewFn<WEAK>) -> crate::network::review::Ask {
    use crate::network::review::{Asking, Choice, Request};
    let f = Arc::new(f);
    Arc::new(move |r: Request| -> Asking {
        let f = f.clone();
        Box::pin(async move {
            let req = NetworkReviewRequest {
                authority: r.authority,
                host: r.host,
                port: u32::from(r.port),
                unicode: r.unicode,
                mixed_scripts: r.mixed_scripts,
            };
            match f.call_async_catch(req).await {
                Ok(promise) => promise.await.map(|s| Choice::parse(&s)).unwrap_or(Choice::Cancelled),
                Err(_) => Choice::Cancelled,
            }
        })
    })
}
