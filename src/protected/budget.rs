//! What the host may spend on one sandbox's changes to what it watches,
//! while a call runs or not: the guard's inert renames, counted over the
//! sandbox's life, and the CPU time of the watches' reactions (the
//! guard's, the project-secret watch's and the host-secret watch's), a
//! budget per second. Past either bound the sandbox is stopped, like any
//! containment event, and the next result says why on one line: a sandbox
//! cannot keep the host busy without end, nor fill the project with inert
//! names.
//!
//! The reactions are also paced (one batch of events every [`PACE`] at
//! most while events keep coming, the kernel queueing them meanwhile), so
//! that the wake-ups around the measured work stay few.
//!
//! Not charged: the walks on the host's own schedule (the guard's every
//! few seconds, and the checks at the end of and before each execution),
//! whose cost the walk's entry limit bounds; a walk a reaction asks for
//! on top of those is charged.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::KillSlot;
pub use crate::inotify::PACE;

/// Most inert renames in one sandbox's life (`0` or nothing: the default).
pub const MAX_INERT_ENV: &str = "PI_SANDBOX_MAX_INERT";
pub const DEFAULT_MAX_INERT: usize = 256;
/// Milliseconds of host CPU a second that the watches may spend on one
/// sandbox's changes, on average (`0` or nothing: the default).
pub const WATCH_CPU_ENV: &str = "PI_SANDBOX_WATCH_CPU";
pub const DEFAULT_WATCH_CPU: Duration = Duration::from_millis(100);
/// The CPU budget holds this many seconds of its rate: a burst (a
/// checkout that makes thousands of directories) draws on it.
pub const BURST_SECONDS: u32 = 50;

/// The bounds of one sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLimits {
    pub renames: usize,
    pub cpu_per_second: Duration,
}

pub const DEFAULT_BUDGET: BudgetLimits = BudgetLimits { renames: DEFAULT_MAX_INERT, cpu_per_second: DEFAULT_WATCH_CPU };

/// The bounds the settings give (a positive whole number each; anything
/// else keeps the default).
pub fn budget_limits(renames: Option<&str>, cpu_ms: Option<&str>) -> BudgetLimits {
    let parse = |v: Option<&str>| v.and_then(|v| v.trim().parse::<u64>().ok()).filter(|n| *n > 0);
    BudgetLimits {
        renames: parse(renames).map_or(DEFAULT_MAX_INERT, |n| n as usize),
        cpu_per_second: parse(cpu_ms).map_or(DEFAULT_WATCH_CPU, Duration::from_millis),
    }
}

/// One sandbox's budget, shared by its watches.
#[derive(Debug)]
pub struct Budget {
    limits: BudgetLimits,
    renames: AtomicUsize,
    /// CPU time left, and when it was last topped up.
    cpu: parking_lot::Mutex<(Duration, Instant)>,
    /// The sandbox's process group and where to say why it was stopped.
    target: (i32, KillSlot),
    stopped: AtomicBool,
}

impl Budget {
    pub fn new(limits: BudgetLimits, group: i32, killed_for: KillSlot) -> Budget {
        Budget {
            limits,
            renames: AtomicUsize::new(0),
            cpu: parking_lot::Mutex::new((limits.cpu_per_second * BURST_SECONDS, Instant::now())),
            target: (group, killed_for),
            stopped: AtomicBool::new(false),
        }
    }

    /// Whether the budget stopped the sandbox.
    pub fn exceeded(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// One inert rename (of `rel`, in the project): past the bound the
    /// sandbox is stopped (the rename itself is made all the same).
    pub fn renamed(&self, rel: &std::path::Path) {
        let n = self.renames.fetch_add(1, Ordering::AcqRel) + 1;
        if n > self.limits.renames {
            self.stop(format!(
                "the sandbox made more protected names in the project than the host renames for one sandbox: {n} \
                 renamed to inert names (the last {}), the most is {} (PI_SANDBOX_MAX_INERT); it was stopped",
                crate::display::one_line(&rel),
                self.limits.renames
            ));
        }
    }

    /// Run `f`, charging the CPU time it takes on this thread: past the
    /// budget the sandbox is stopped.
    pub fn charge<T>(&self, what: &str, f: impl FnOnce() -> T) -> T {
        let began = thread_cpu();
        let out = f();
        self.spend(what, thread_cpu().saturating_sub(began));
        out
    }

    fn spend(&self, what: &str, spent: Duration) {
        let over = {
            let mut cpu = self.cpu.lock();
            let now = Instant::now();
            let cap = self.limits.cpu_per_second * BURST_SECONDS;
            let earned = self.limits.cpu_per_second.mul_f64(now.duration_since(cpu.1).as_secs_f64());
            let left = (cpu.0 + earned).min(cap);
            *cpu = (left.saturating_sub(spent), now);
            spent > left
        };
        if over {
            self.stop(format!(
                "the sandbox kept the host busy {what}: more than {} ms of CPU a second on average (over {} s), the \
                 most for one sandbox (PI_SANDBOX_WATCH_CPU); it was stopped",
                self.limits.cpu_per_second.as_millis(),
                BURST_SECONDS
            ));
        }
    }

    fn stop(&self, why: String) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        let (group, killed_for) = &self.target;
        killed_for.lock().get_or_insert(super::HostKill::Budget(why.clone()));
        tracing::debug!(group, why, "host budget exceeded; sandbox killed");
        crate::spawn::kill_group(*group);
    }
}

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protected::HostKill;

    fn budget(limits: BudgetLimits) -> (Budget, KillSlot) {
        let killed: KillSlot = Default::default();
        // Group 0 is never killed (kill_group ignores it).
        (Budget::new(limits, 0, killed.clone()), killed)
    }

    #[test]
    fn settings_give_the_bounds() {
        assert_eq!(budget_limits(None, None), DEFAULT_BUDGET);
        assert_eq!(
            budget_limits(Some(" 10 "), Some("250")),
            BudgetLimits { renames: 10, cpu_per_second: Duration::from_millis(250) }
        );
        assert_eq!(budget_limits(Some("0"), Some("x")), DEFAULT_BUDGET);
    }

    #[test]
    fn renames_past_the_bound_stop_the_sandbox_once_on_one_line() {
        let (b, killed) = budget(BudgetLimits { renames: 3, ..DEFAULT_BUDGET });
        for _ in 0..3 {
            b.renamed(std::path::Path::new("d/.envrc"));
        }
        assert!(!b.exceeded() && killed.lock().is_none());
        b.renamed(std::path::Path::new("d/x\n.git"));
        b.renamed(std::path::Path::new("later"));
        let kill = killed.lock().clone();
        assert!(matches!(kill, Some(HostKill::Budget(_))), "{kill:?}");
        let why = kill.map(|k| k.to_string()).unwrap_or_default();
        assert!(b.exceeded());
        assert!(why.contains("4 renamed") && why.contains("d/x\u{240a}.git") && !why.contains('\n'), "{why}");
    }

    #[test]
    fn cpu_past_the_burst_stops_the_sandbox_and_the_rate_refills_it() {
        let (b, killed) = budget(BudgetLimits { cpu_per_second: Duration::from_millis(100), ..DEFAULT_BUDGET });
        b.spend("x", Duration::from_secs(5));
        assert!(!b.exceeded(), "the whole burst of 5 s");
        std::thread::sleep(Duration::from_millis(30));
        b.spend("x", Duration::from_millis(2));
        assert!(!b.exceeded(), "the rate refilled 3 ms");
        // 40 ms of this thread's CPU, not of wall time: on a loaded machine 40 ms of wall time
        // can be a few ms of CPU, which the refill covers.
        let spun = b.charge("reacting to names", || {
            let until = thread_cpu() + Duration::from_millis(40);
            let mut n = 0u64;
            while thread_cpu() < until {
                n = n.wrapping_add(1);
            }
            n
        });
        assert!(spun > 0 && b.exceeded(), "40 ms of this thread's CPU is more than is left");
        let kill = killed.lock().clone();
        assert!(matches!(kill, Some(HostKill::Budget(_))), "{kill:?}");
        let why = kill.map(|k| k.to_string()).unwrap_or_default();
        assert!(why.contains("busy reacting to names") && why.contains("100 ms"), "{why}");
    }
}
