//! The Node layer of the trusted configuration: `loadTrustedConfig`, a
//! conversion of `config::load` and nothing else.
//!
//! Every error and notice leaves through `display` (a name found in the
//! project is the project's, and may hold control characters).

use std::path::Path;

use napi_derive::napi;

use crate::config::{self, Loaded};
use crate::display::displayed_line;

/// The trusted configuration a session starts with
/// (`<agentDir>/extensions/pi-python-sandbox/config.json`, then
/// `PI_SANDBOX_BASH`). Every value is usable as it is: a part with an error
/// already holds its most restrictive value.
#[napi(object)]
pub struct TrustedConfig {
    /// Where the model's `bash` runs: this package's sandbox, or pi's own
    /// tool on the host.
    #[napi(ts_type = "'sandbox' | 'host'")]
    pub bash: String,
    /// Where `bash` came from: `default`, `file`, `environment`
    /// (`PI_SANDBOX_BASH`, which wins over the file) or `fallback` (an
    /// error made it `sandbox`).
    #[napi(ts_type = "'default' | 'file' | 'environment' | 'fallback'")]
    pub bash_source: String,
    /// Where the user's `!cmd` runs.
    #[napi(ts_type = "'host' | 'sandbox'")]
    pub user_bash: String,
    /// Host paths (absolute, normalised) a sandboxed command may read.
    pub additional_allow_read: Vec<String>,
    /// Names of pi's environment variables a sandboxed command gets.
    pub env_passthrough: Vec<String>,
    /// What is wrong, each naming the file or the key path (show them in
    /// the first result and a notification).
    pub errors: Vec<String>,
    /// What to tell the user once (a project's file that is ignored).
    pub notices: Vec<String>,
    /// The trusted file's path.
    pub path: String,
    /// The file was there (and so was read, or its error is in `errors`).
    pub found: bool,
    /// The `network` part, entries in canonical form.
    pub network: NetworkSettings,
}

/// The sandboxes' network as the trusted file says (see `docs/network.md`).
#[napi(object)]
#[derive(Clone)]
pub struct NetworkSettings {
    #[napi(ts_type = "'off' | 'proxy'")]
    pub mode: String,
    pub allowed_domains: Vec<String>,
    pub denied_domains: Vec<String>,
    pub allow_private: Vec<String>,
    /// `network.review.yolo`: in yolo mode, an unmatched destination is
    /// allowed without review (`allow`, the default) or reviewed.
    #[napi(ts_type = "'allow' | 'review'")]
    pub review_yolo: Option<String>,
    /// Why the network is off when an error turned it off.
    pub off_because: Option<String>,
    /// `network.python`: the python tool gets the same proxy (unset: no).
    pub python: Option<bool>,
}

fn network_settings(n: &config::NetworkConfig) -> NetworkSettings {
    use crate::network::policy::Mode;
    NetworkSettings {
        mode: if n.mode == Mode::Proxy { "proxy" } else { "off" }.into(),
        allowed_domains: n.lists.allowed.iter().map(|r| r.to_string()).collect(),
        denied_domains: n.lists.denied.iter().map(|r| r.to_string()).collect(),
        allow_private: n.lists.allow_private.iter().map(|r| r.to_string()).collect(),
        review_yolo: Some(
            if n.review_yolo == crate::network::policy::YoloReview::Review { "review" } else { "allow" }.into(),
        ),
        off_because: n.off_because.clone().map(displayed_line),
        python: Some(n.python),
    }
}

/// Read the trusted configuration at session start: `agentDir` is pi's
/// `getAgentDir()`, `projectDir` the session's working directory (searched,
/// never read, for a project's own file; empty: none). Never throws.
#[napi]
#[allow(dead_code)] // called from JS only
pub fn load_trusted_config(agent_dir: String, project_dir: String) -> TrustedConfig {
    let project = (!project_dir.is_empty()).then(|| Path::new(&project_dir));
    let bash_env = std::env::var(config::BASH_ENV).ok();
    converted(config::load(Path::new(&agent_dir), project, bash_env.as_deref()))
}

fn converted(l: Loaded) -> TrustedConfig {
    let lossy = |p: &Path| p.to_string_lossy().into_owned();
    let network = network_settings(&l.config.network);
    TrustedConfig {
        network,
        bash: l.config.bash.as_str().into(),
        bash_source: l.bash_source.as_str().into(),
        user_bash: l.config.user_bash.as_str().into(),
        additional_allow_read: l.config.additional_allow_read.iter().map(|p| lossy(p)).collect(),
        env_passthrough: l.config.env_passthrough,
        errors: l.errors.iter().map(|e| displayed_line(e.to_string())).collect(),
        notices: l.notices.into_iter().map(displayed_line).collect(),
        path: lossy(&l.path),
        found: l.found,
    }
}
