//! Every setting, read in this one place into one resolved struct.
//!
//! The engine's settings (what every sandbox gets: sizes, caps, masks,
//! protected names, budgets, the spare, the log) are `PI_SANDBOX_*`; the
//! Python runtime's are `PI_PYTHON_TOOL_*` (the interpreter, its packages,
//! rollback). Each engine setting is also read under its earlier name,
//! `PI_PYTHON_TOOL_` and the same suffix; where both are set, the engine
//! name wins and `status` names the other as ignored.
//!
//! The settings are read when they are used: once per session for the
//! interpreter, the Python packages and the spare, once per sandbox start
//! for the rest (so that a fixed setting applies from the next start), and
//! by `status` to describe what the next start would get. Each module
//! keeps the meaning of its own settings (parsing, defaults); this module
//! only gathers the raw values.

use std::path::PathBuf;

use crate::contain::{caps, Caps, MAX_MEMORY_ENV, MAX_TASKS_ENV};
use crate::gitconfig::HostGit;
use crate::hostsecrets::{HostSecrets, HOST_SECRETS_ENV};
use crate::limits::{tmpfs_sizes, SettingError, TmpfsSizes, SHM_SIZE_ENV, TMP_SIZE_ENV};
use crate::permissions::MountConfig;
use crate::protected::{budget_limits, patterns, BudgetLimits, Pattern, MAX_INERT_ENV, PROTECTED_ENV, WATCH_CPU_ENV};
use crate::scan::{limits, Limits, DEPTH_ENV, ENTRIES_ENV};
use crate::scratch::{note_threshold, SCRATCH_NOTE_ENV};
use crate::secrets::{SecretRules, SECRETS_ENV};

/// The interpreter (an absolute path; default /usr/bin/python3).
pub const INTERPRETER_ENV: &str = "PI_PYTHON_TOOL_INTERPRETER";
/// The user's Python packages: a venv or site directories, colon separated.
pub const VENV_ENV: &str = "PI_PYTHON_TOOL_VENV";
/// `1` adds the system's dist-packages.
pub const SYSTEM_SITE_ENV: &str = "PI_PYTHON_TOOL_SYSTEM_SITE";
/// `0`, `false`, `off` or `no` turns the spare sandbox off.
pub const PREWARM_ENV: &str = "PI_SANDBOX_PREWARM";
/// The output cap of one bash command (see `shell`).
pub const MAX_OUTPUT_ENV: &str = "PI_SANDBOX_BASH_MAX_OUTPUT";

#[derive(Debug, Clone, Default)]
/// What the caller of a session decides (the rest comes from [`Settings`]).
pub struct SessionOptions {
    /// The project directory (mounted at /workspace).
    pub project_dir: PathBuf,
    /// Other host names of it (the working directory as pi named it, before
    /// links were resolved): like its canonical path and `project_dir`,
    /// each is a link to /workspace in the sandbox where one can be made.
    pub project_names: Vec<PathBuf>,
    /// Where session directories are made; default `<tmp>/pi-python-sandbox-<uid>`.
    pub runtime_root: Option<PathBuf>,
    /// Interpreter path; default `$PI_PYTHON_TOOL_INTERPRETER`, else /usr/bin/python3.
    pub interpreter: Option<String>,
    /// Initial mounts; change them later with [`Session::set_mounts`].
    pub mounts: MountConfig,
    /// The user's Python packages (a venv or site directories, colon
    /// separated); default `$PI_PYTHON_TOOL_VENV`.
    pub python_packages: Option<String>,
    /// Add the system's dist-packages; default `$PI_PYTHON_TOOL_SYSTEM_SITE` = 1.
    pub system_site_packages: Option<bool>,
    /// Keep a spare sandbox ready (default: `$PI_SANDBOX_PREWARM`,
    /// on unless it is `0`, `false`, `off` or `no`).
    pub prewarm: Option<bool>,
    /// Roll failed calls back (default: `$PI_PYTHON_TOOL_ROLLBACK`, on
    /// unless it is `0`, `false`, `off` or `no`; read at each sandbox start).
    pub rollback: Option<bool>,
    /// How the guard of a writable sandbox gets its inotify instance
    /// (default `inotify_init1`; tests make it fail).
    pub guard_inotify: Option<crate::protected::InotifyInit>,
}

impl SessionOptions {
    /// The settings an option of the caller's gives, over the
    /// environment's value.
    pub fn set_by_caller(&self) -> Vec<&'static str> {
        [
            (self.interpreter.is_some(), INTERPRETER_ENV),
            (self.python_packages.is_some(), VENV_ENV),
            (self.system_site_packages.is_some(), SYSTEM_SITE_ENV),
            (self.prewarm.is_some(), PREWARM_ENV),
            (self.rollback.is_some(), ROLLBACK_ENV),
        ]
        .into_iter()
        .filter_map(|(set, name)| set.then_some(name))
        .collect()
    }
}

/// `0`, `false`, `off` or `no`: no rollback (the spec's recovery: the
/// sandbox is killed and the next call gets a new one).
pub const ROLLBACK_ENV: &str = "PI_PYTHON_TOOL_ROLLBACK";

fn is_off(value: Option<String>) -> bool {
    matches!(value.map(|v| v.trim().to_ascii_lowercase()).as_deref(), Some("0" | "false" | "off" | "no"))
}

/// The settings in force.
#[derive(Debug, Clone)]
pub struct Settings {
    pub interpreter: Option<String>,
    pub venv: Option<String>,
    pub system_site: bool,
    pub prewarm: bool,
    /// Failed calls roll back, and a reset is a fresh interpreter in the
    /// same sandbox (see `worker`).
    pub rollback: bool,
    pub protected: Vec<Pattern>,
    /// The secret patterns (see `secrets`), masked in every mode.
    pub secrets: SecretRules,
    pub scan: Limits,
    /// What the host may spend on one sandbox's changes to the project
    /// (see `protected::budget`).
    pub budget: BudgetLimits,
    /// The sizes of /tmp and /dev/shm, or why the setting is not one.
    pub tmpfs: Result<TmpfsSizes, SettingError>,
    /// The caps on one sandbox's tasks and memory, or why the setting is
    /// not one (see `contain`).
    pub caps: Result<Caps, SettingError>,
    /// The size of /scratch past which results and `status` say so.
    pub scratch_note: u64,
    pub git: HostGit,
    /// Entries added to the host secrets (see [`Settings::host_secrets`]).
    pub host_secrets_extra: Option<String>,
    /// `$HOME`: what `~` in a read root and in the host secrets means.
    pub home: Option<PathBuf>,
    /// The level of the debug log (see `debuglog`), when it is on.
    pub log: Option<tracing::Level>,
    /// Earlier names set alongside their engine name, and so ignored.
    pub shadowed: Vec<&'static str>,
    /// The settings the environment sets, in the order of [`SETTINGS`],
    /// each with the name it was read under.
    pub set: Vec<(&'static str, Source)>,
}

/// Where a setting in force was read from (the others are at their
/// defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The environment, under the setting's own name.
    Environment,
    /// The environment, under the setting's earlier name (this one).
    EarlierName(&'static str),
}

/// Every setting of the environment's, in the order of the table in
/// docs/settings.md.
pub const SETTINGS: [&str; 21] = [
    ROLLBACK_ENV,
    INTERPRETER_ENV,
    VENV_ENV,
    SYSTEM_SITE_ENV,
    crate::config::BASH_ENV,
    PREWARM_ENV,
    crate::live_grants::LIVE_ENV,
    MAX_OUTPUT_ENV,
    TMP_SIZE_ENV,
    SHM_SIZE_ENV,
    MAX_TASKS_ENV,
    MAX_MEMORY_ENV,
    SCRATCH_NOTE_ENV,
    SECRETS_ENV,
    HOST_SECRETS_ENV,
    PROTECTED_ENV,
    ENTRIES_ENV,
    DEPTH_ENV,
    MAX_INERT_ENV,
    WATCH_CPU_ENV,
    crate::debuglog::LOG_ENV,
];

/// The engine's settings, each with the name it had when the engine ran
/// only Python (still read; see the module's documentation).
pub const ENGINE_SETTINGS: [(&str, &str); 14] = [
    (PREWARM_ENV, "PI_PYTHON_TOOL_PREWARM"),
    (PROTECTED_ENV, "PI_PYTHON_TOOL_PROTECTED"),
    (SECRETS_ENV, "PI_PYTHON_TOOL_SECRETS"),
    (ENTRIES_ENV, "PI_PYTHON_TOOL_SCAN_ENTRIES"),
    (DEPTH_ENV, "PI_PYTHON_TOOL_SCAN_DEPTH"),
    (MAX_INERT_ENV, "PI_PYTHON_TOOL_MAX_INERT"),
    (WATCH_CPU_ENV, "PI_PYTHON_TOOL_WATCH_CPU"),
    (TMP_SIZE_ENV, "PI_PYTHON_TOOL_TMP_SIZE"),
    (SHM_SIZE_ENV, "PI_PYTHON_TOOL_SHM_SIZE"),
    (MAX_TASKS_ENV, "PI_PYTHON_TOOL_MAX_TASKS"),
    (MAX_MEMORY_ENV, "PI_PYTHON_TOOL_MAX_MEMORY"),
    (SCRATCH_NOTE_ENV, "PI_PYTHON_TOOL_SCRATCH_NOTE"),
    (HOST_SECRETS_ENV, "PI_PYTHON_TOOL_HOST_SECRETS"),
    (crate::debuglog::LOG_ENV, "PI_PYTHON_TOOL_LOG"),
];

/// The earlier name of an engine setting.
pub fn earlier_name(name: &str) -> Option<&'static str> {
    ENGINE_SETTINGS.iter().find(|(n, _)| *n == name).map(|(_, e)| *e)
}

impl Settings {
    /// Host paths no read grant mounts (see `hostsecrets`); made when
    /// needed, since it looks at the file system.
    /// `trees`: trees the sandbox can write (nothing is resolved there).
    pub fn host_secrets(&self, trees: &[&std::path::Path]) -> HostSecrets {
        HostSecrets::new(self.host_secrets_extra.as_deref(), self.home.as_deref(), trees)
    }

    /// The settings from this process's environment.
    pub fn from_env() -> Settings {
        Settings::from_lookup(|name| std::env::var(name).ok(), HostGit::from_env())
    }

    /// The settings from `get` (a variable's value by name).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>, git: HostGit) -> Settings {
        let home = get("HOME").filter(|h| !h.is_empty()).map(PathBuf::from);
        let python = &get;
        // An engine setting under its name, else under its earlier one.
        let mut shadowed = Vec::new();
        let mut by_earlier = Vec::new();
        for (name, earlier) in ENGINE_SETTINGS {
            match (get(name).is_some(), get(earlier).is_some()) {
                (true, true) => shadowed.push(name),
                (false, true) => by_earlier.push(name),
                _ => {}
            }
        }
        let set = SETTINGS
            .iter()
            .filter_map(|&name| match (get(name), earlier_name(name)) {
                (Some(_), _) => Some((name, Source::Environment)),
                (None, Some(earlier)) if get(earlier).is_some() => Some((name, Source::EarlierName(earlier))),
                (None, _) => None,
            })
            .collect();
        let get = |name: &str| get(name).or_else(|| earlier_name(name).and_then(&get));
        // A value that is not one names the variable it came from.
        let named =
            |e: SettingError| e.renamed(|n| if by_earlier.contains(&n) { earlier_name(n).unwrap_or(n) } else { n });
        Settings {
            interpreter: python(INTERPRETER_ENV),
            venv: python(VENV_ENV),
            system_site: python(SYSTEM_SITE_ENV).is_some_and(|v| v.trim() == "1"),
            prewarm: !is_off(get(PREWARM_ENV)),
            rollback: !is_off(python(ROLLBACK_ENV)),
            protected: patterns(get(PROTECTED_ENV).as_deref()),
            secrets: SecretRules::new(get(SECRETS_ENV).as_deref()),
            scan: limits(get(ENTRIES_ENV).as_deref(), get(DEPTH_ENV).as_deref()),
            budget: budget_limits(get(MAX_INERT_ENV).as_deref(), get(WATCH_CPU_ENV).as_deref()),
            tmpfs: tmpfs_sizes(get(TMP_SIZE_ENV).as_deref(), get(SHM_SIZE_ENV).as_deref()).map_err(named),
            caps: caps(get(MAX_TASKS_ENV).as_deref(), get(MAX_MEMORY_ENV).as_deref()).map_err(named),
            scratch_note: note_threshold(get(SCRATCH_NOTE_ENV).as_deref()),
            host_secrets_extra: get(HOST_SECRETS_ENV),
            home,
            log: crate::debuglog::level(get(crate::debuglog::LOG_ENV).as_deref()),
            git,
            shadowed,
            set,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_settings_are_read_under_their_earlier_names_too_and_their_own_wins() {
        let vars = [
            ("PI_PYTHON_TOOL_MAX_TASKS", "64"),
            ("PI_PYTHON_TOOL_TMP_SIZE", "8M"),
            ("PI_SANDBOX_TMP_SIZE", "16M"),
            ("PI_SANDBOX_PROTECTED", ".x"),
        ];
        let get = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        let s = Settings::from_lookup(get, HostGit::default());
        assert_eq!(s.caps.as_ref().map(|c| c.tasks).ok(), Some(64), "the earlier name alone is read");
        assert_eq!(s.tmpfs.as_ref().map(|t| t.tmp).ok(), Some(16 << 20), "the engine name wins");
        assert_eq!(s.shadowed, [TMP_SIZE_ENV]);
        assert_eq!(s.protected.len(), 1);
        // The Python runtime's own settings have no other name.
        let py = Settings::from_lookup(|k| (k == "PI_SANDBOX_ROLLBACK").then(|| "0".to_string()), HostGit::default());
        assert!(py.rollback);
        for (name, earlier) in ENGINE_SETTINGS {
            assert!(name.starts_with("PI_SANDBOX_"), "{name}");
            assert_eq!(earlier, name.replace("PI_SANDBOX_", "PI_PYTHON_TOOL_"));
        }
        // A bad value names the variable it was read from.
        let bad =
            Settings::from_lookup(|k| (k == "PI_PYTHON_TOOL_TMP_SIZE").then(|| "lots".into()), HostGit::default());
        assert!(bad.tmpfs.unwrap_err().to_string().starts_with("PI_PYTHON_TOOL_TMP_SIZE=\"lots\" is not a size"));
        let bad = Settings::from_lookup(|k| (k == "PI_SANDBOX_MAX_TASKS").then(|| "2".into()), HostGit::default());
        assert!(bad.caps.unwrap_err().to_string().starts_with("PI_SANDBOX_MAX_TASKS=\"2\""));
    }

    #[test]
    fn each_setting_set_is_named_with_the_name_it_was_read_under() {
        let vars = [
            ("PI_PYTHON_TOOL_MAX_TASKS", "64"),
            ("PI_PYTHON_TOOL_TMP_SIZE", "8M"),
            ("PI_SANDBOX_TMP_SIZE", "16M"),
            (ROLLBACK_ENV, "0"),
            ("PI_SANDBOX_BASH", "1"),
            ("PI_SANDBOX_ROLLBACK", "0"),
        ];
        let get = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        let s = Settings::from_lookup(get, HostGit::default());
        assert_eq!(
            s.set,
            [
                (ROLLBACK_ENV, Source::Environment),
                (crate::config::BASH_ENV, Source::Environment),
                (TMP_SIZE_ENV, Source::Environment),
                (MAX_TASKS_ENV, Source::EarlierName("PI_PYTHON_TOOL_MAX_TASKS")),
            ]
        );
        assert!(Settings::from_lookup(|_| None, HostGit::default()).set.is_empty());
        let every: std::collections::BTreeSet<_> = SETTINGS.iter().collect();
        assert_eq!(every.len(), SETTINGS.len(), "each setting once");
        for (name, _) in ENGINE_SETTINGS {
            assert!(SETTINGS.contains(&name), "{name}");
        }
    }

    #[test]
    fn the_caller_s_options_name_the_settings_they_give() {
        assert!(SessionOptions::default().set_by_caller().is_empty());
        let opts = SessionOptions { rollback: Some(true), interpreter: Some("/p".into()), ..Default::default() };
        assert_eq!(opts.set_by_caller(), [INTERPRETER_ENV, ROLLBACK_ENV]);
    }

    #[test]
    fn settings_come_from_the_named_variables() {
        let vars = [
            (INTERPRETER_ENV, "/opt/py/bin/python3"),
            (VENV_ENV, "/v"),
            (SYSTEM_SITE_ENV, " 1 "),
            (PREWARM_ENV, "Off"),
            (PROTECTED_ENV, ".a:b/c"),
            (ENTRIES_ENV, "10"),
            (DEPTH_ENV, "x"),
            (TMP_SIZE_ENV, "8M"),
            (ROLLBACK_ENV, " no"),
            (MAX_TASKS_ENV, "64"),
            (SCRATCH_NOTE_ENV, "10M"),
            (HOST_SECRETS_ENV, "/srv/vault"),
            ("HOME", "/nonexistent-home"),
            (SECRETS_ENV, "*.db"),
            (MAX_INERT_ENV, "40"),
            (WATCH_CPU_ENV, "300"),
        ];
        let get = |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string());
        let s = Settings::from_lookup(get, HostGit::default());
        assert_eq!(s.interpreter.as_deref(), Some("/opt/py/bin/python3"));
        assert_eq!(s.venv.as_deref(), Some("/v"));
        assert!(s.system_site && !s.prewarm && !s.rollback);
        assert_eq!(s.protected, [Pattern::Name(".a".into()), Pattern::Path("b/c".into())]);
        assert_eq!((s.scan.max_entries, s.scan.max_depth), (10, crate::scan::DEFAULT_LIMITS.max_depth));
        assert_eq!(s.tmpfs.as_ref().map(|t| t.tmp), Ok(8 << 20));
        assert_eq!(s.caps, Ok(Caps { tasks: 64, memory: crate::contain::DEFAULT_MAX_MEMORY }));
        assert_eq!(s.scratch_note, 10 << 20);
        assert_eq!(s.budget, BudgetLimits { renames: 40, cpu_per_second: std::time::Duration::from_millis(300) });
        let secrets: Vec<String> = s.host_secrets(&[]).entries.iter().map(|e| e.shown()).collect();
        assert!(secrets.contains(&"/srv/vault".into()) && secrets.contains(&"/nonexistent-home/.ssh".into()));
        assert_eq!(s.secrets.describe(), ["*.db"]);
        let none = Settings::from_lookup(|_| None, HostGit::default());
        assert!(none.prewarm && none.rollback && !none.system_site && none.interpreter.is_none());
        assert_eq!(none.budget, crate::protected::DEFAULT_BUDGET);
        assert_eq!(none.protected.len(), crate::protected::DEFAULT_PROTECTED.len());
        assert_eq!(none.secrets, SecretRules::new(None));
        let off = Settings::from_lookup(|k| (k == SECRETS_ENV).then(String::new), HostGit::default());
        assert!(off.secrets.is_empty());
    }
}
