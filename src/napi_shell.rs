//! The bash tool's entry points on `PythonSandbox`: run one command in a
//! sandbox of its own, abort it, set what the trusted configuration adds.
//! Conversions only; `shell` and `session::shell` do the work.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use napi::bindgen_prelude::*;
use napi::threadsafe_function::{ThreadsafeFunction, ThreadsafeFunctionCallMode};
use napi_derive::napi;

use crate::napi::review::{asker, ReviewFn};
use crate::napi::sandbox::PythonSandbox;
use crate::napi::{call_id_of, invalid};
use crate::shell::{Command, Ending, ShellConfig, ShellError};

/// The longest command the tool takes (pi's own bash has no bound; this
/// one keeps the host's argv and memory bounded).
const MAX_COMMAND_BYTES: usize = 1024 * 1024;
/// The longest timeout, in seconds (a day).
const MAX_SHELL_TIMEOUT_SECONDS: f64 = 86_400.0;

/// One command of the bash tool.
#[napi(object)]
pub struct ShellOptions {
    /// pi's working directory for the command (inside the project).
    pub cwd: String,
    /// The user's `shellPath` setting.
    pub shell_path: Option<String>,
    /// Seconds; none for no timeout.
    pub timeout_seconds: Option<f64>,
    /// pi's session variables; only `PI_*` names that are no credential
    /// pass, everything else is ignored.
    pub env: Option<std::collections::HashMap<String, String>>,
}

/// How a command ended.
#[napi(object)]
pub struct ShellResult {
    /// The exit code, 128 + the signal for a kill; null after a timeout
    /// or an abort.
    pub exit_code: Option<i32>,
    /// `exited`, `signalled`, `timed_out`, `aborted`, `flooded` (past the
    /// output cap) or `stopped` (a secret appeared).
    pub ending: String,
    /// Sentences for the end of the result, safe to show.
    pub notes: Vec<String>,
}

/// What the trusted configuration adds to every command.
#[napi(object)]
pub struct ShellSettings {
    pub additional_allow_read: Option<Vec<String>>,
    pub env_passthrough: Option<Vec<String>>,
    /// Where that configuration is (the hints name it).
    pub config_path: Option<String>,
    /// The trusted file's `network` part; none: no network.
    pub network: Option<crate::napi_config::NetworkSettings>,
}

/// Why the network is off when its part is in error (not when it is off
/// by choice).
fn network_off(n: Option<&crate::napi_config::NetworkSettings>) -> Option<String> {
    let n = n?;
    if let Some(why) = &n.off_because {
        return Some(format!("the configuration's network part is in error ({why})"));
    }
    (n.mode == "proxy" && proxy_policy(Some(n.clone())).is_none())
        .then(|| "an entry of the configuration's network part is malformed".to_string())
}

/// The proxy's policy from the trusted file's network part, entries read
/// again by the same grammar; `off` or any entry in error: no network.
fn proxy_policy(n: Option<crate::napi_config::NetworkSettings>) -> Option<crate::network::proxy::Policy> {
    use crate::network::policy::{parse_private, parse_rule, List, Lists, YoloReview};
    let n = n.filter(|n| n.mode == "proxy" && n.off_because.is_none())?;
    let rules = |v: &[String], list| v.iter().map(|e| parse_rule(e, list).ok()).collect::<Option<Vec<_>>>();
    let lists = Lists {
        allowed: rules(&n.allowed_domains, List::Allowed)?,
        denied: rules(&n.denied_domains, List::Denied)?,
        allow_private: n.allow_private.iter().map(|e| parse_private(e).ok()).collect::<Option<Vec<_>>>()?,
    };
    Some(crate::network::proxy::Policy {
        lists,
        own: crate::network::addr::own_addresses(),
        // Per command, from the session's mode.
        yolo: false,
        yolo_review: match n.review_yolo.as_deref() {
            None | Some("allow") => YoloReview::Allow,
            Some("review") => YoloReview::Review,
            Some(_) => return None,
        },
        bounds: Default::default(),
    })
}

/// The bash tool's sandbox started ahead of need for the next command.
#[napi(object)]
pub struct ShellSpareStatus {
    /// `none`, `starting` or `ready`.
    pub state: crate::outcome::SpareState,
    /// Bubblewrap's pid when it is ready.
    pub pid: Option<i32>,
    /// How many commands of the session ran in one.
    pub used: f64,
}

impl From<crate::session::ShellSpare> for ShellSpareStatus {
    fn from(s: crate::session::ShellSpare) -> Self {
        ShellSpareStatus { state: s.state, pid: s.pid, used: s.used as f64 }
    }
}

fn ending_name(e: &Ending) -> &'static str {
    match e {
        Ending::Exited(_) => "exited",
        Ending::Signalled(_) => "signalled",
        Ending::TimedOut => "timed_out",
        Ending::Aborted => "aborted",
        Ending::Flooded => "flooded",
        Ending::Stopped(_) => "stopped",
    }
}

#[napi]
impl PythonSandbox {
    /// Run `command` with the bash tool's sandbox: one of its own, the
    /// project at its host path, the session's mode, read roots and
    /// protections. Output goes to `onData` as it comes, made safe.
    /// Rejects with the reason and the fix when no sandbox can start: the
    /// command then ran nowhere.
    /// With `onReview`, a destination no entry matches is reviewed through
    /// it; without, it is refused at once (no UI).
    #[napi(ts_args_type = "callId: number, command: string, options: ShellOptions, onData: (text: string) => void, \
                           onReview?: ((request: NetworkReviewRequest) => Promise<string>) | undefined | null")]
    pub async fn exec_shell(
        &self,
        call_id: f64,
        command: String,
        options: ShellOptions,
        on_data: ThreadsafeFunction<String, (), String, Status, false, true>,
        on_review: Option<ReviewFn>,
    ) -> Result<ShellResult> {
        let id = call_id_of(call_id)?;
        if command.len() > MAX_COMMAND_BYTES {
            return Err(invalid(format!("The command is longer than {} KiB.", MAX_COMMAND_BYTES / 1024)));
        }
        if command.contains('\0') {
            return Err(invalid("The command contains a NUL byte."));
        }
        if !options.cwd.starts_with('/') {
            return Err(invalid("cwd must be an absolute path"));
        }
        let timeout = match options.timeout_seconds {
            None => None,
            Some(t) if t > 0.0 && t <= MAX_SHELL_TIMEOUT_SECONDS => Some(Duration::from_secs_f64(t)),
            Some(_) => return Err(invalid("timeoutSeconds must be above 0 and at most a day.")),
        };
        let cmd = Command {
            command,
            cwd: PathBuf::from(options.cwd),
            shell: options.shell_path.filter(|s| !s.is_empty()).map(PathBuf::from),
            timeout,
            pi_env: options.env.unwrap_or_default().into_iter().collect(),
            reviewing: crate::network::review::Reviewing {
                ask: on_review.map(asker),
                yolo: self.mode_name().as_deref() == Some("yolo"),
            },
        };
        let f = Arc::new(on_data);
        let calls = f.clone();
        let on_data = move |text: String| {
            calls.call(text, ThreadsafeFunctionCallMode::NonBlocking);
        };
        let ended = self.session().exec_shell(id, cmd, &on_data).await;
        // The output is queued for the main thread, which runs at most
        // 1,000 queued calls per turn, and the result comes through a queue
        // of its own: past that many chunks, the result could come first, and
        // pi's bash, whose output ends with the result, would get the rest
        // after it (pi ends its accumulator there, and a throw from this
        // callback ends the process). An empty call after the last chunk
        // (the JS side passes nothing on for it) is run after every earlier
        // one; the result waits for it.
        let _ = f.call_async_catch(String::new()).await;
        match ended {
            Ok(ended) => Ok(ShellResult {
                exit_code: ended.ending.exit_code(),
                ending: ending_name(&ended.ending).into(),
                notes: ended.notes,
            }),
            Err(ShellError::NotStarted(why)) => Err(Error::new(Status::GenericFailure, why)),
        }
    }

    /// The spare sandbox of the bash tool (see `shell::Spare`).
    #[napi]
    pub fn shell_spare(&self) -> ShellSpareStatus {
        self.session().shell_spare().into()
    }

    /// Resolves once no spare of the bash tool is being started (it is
    /// ready, or none is to be had), with its state then.
    #[napi]
    pub async fn await_shell_spare(&self) -> ShellSpareStatus {
        self.session().shell_spare_settled().await.into()
    }

    /// Abort the command `callId`: every process of its sandbox is killed.
    /// Returns whether one was running.
    #[napi]
    pub fn cancel_shell(&self, call_id: f64) -> Result<bool> {
        Ok(self.session().cancel_shell(call_id_of(call_id)?))
    }

    /// What the trusted configuration adds to every later command.
    #[napi]
    pub fn set_shell_config(&self, settings: ShellSettings) -> Result<()> {
        let mut reads = Vec::new();
        for p in settings.additional_allow_read.unwrap_or_default() {
            let Some(n) = crate::paths::normalize(&p).filter(|_| !p.contains('\0')) else {
                return Err(invalid(format!(
                    "additionalAllowRead: {} is not an absolute path",
                    crate::display::one_line(&p)
                )));
            };
            reads.push(n);
        }
        self.session().set_shell_config(ShellConfig {
            additional_reads: reads,
            passthrough: settings.env_passthrough.unwrap_or_default(),
            config_path: settings.config_path.map(PathBuf::from),
            network_off: network_off(settings.network.as_ref()),
            python_network: settings.network.as_ref().and_then(|n| n.python) == Some(true),
            network: proxy_policy(settings.network),
        });
        Ok(())
    }
}
