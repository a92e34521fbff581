//! The review of a destination no entry matches: the decision state (the
//! grants of the session, of the command and of one connection, and the
//! dialogs pending) lives here; the dialog itself is the caller's
//! [`Ask`] (the extension's `ctx.ui.select`).
//!
//! - Identical pending requests (the same host and port) share one dialog:
//!   20 connections to one host while its dialog is open wait for that
//!   dialog's answer.
//! - "Allow this connection" is used by exactly one connection; the others
//!   waiting on that dialog are reviewed again (a new dialog).
//! - "Allow host:port for this command" and "... for this session" allow
//!   every later connection to that host and port of the command, or of
//!   every command of the session.
//! - "Deny", a cancelled dialog and one past [`REVIEW_DEADLINE`] refuse
//!   every connection waiting on it.
//! - At most [`MAX_PENDING_DIALOGS`] dialogs of one command are open at
//!   once; a connection to yet another destination is refused.
//! - Without an [`Ask`] (no UI) the review is unavailable at once.
//!
//! Dialogs still open when the command ends are dropped with its
//! [`Desk`] (the extension closes its own dialog then).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::addr::Host;
use super::decide::{Destination, Review, Reviewer};

/// How long a dialog may stay open before it counts as cancelled.
pub const REVIEW_DEADLINE: Duration = Duration::from_secs(60);
/// Dialogs of one command open at once.
pub const MAX_PENDING_DIALOGS: usize = 4;
/// Destinations a session can hold grants for (later grants are refused
/// as if cancelled).
pub const MAX_SESSION_GRANTS: usize = 1024;

/// The dialog's options, in the order shown.
pub const OPTIONS: [&str; 4] =
    ["Allow this connection", "Allow host:port for this command", "Allow host:port for this session", "Deny"];

/// What the user chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    Once,
    Command,
    Session,
    Deny,
    /// Dismissed, timed out, aborted, or an answer that is none of the
    /// options.
    Cancelled,
}

impl Choice {
    /// The answer the extension hands back: `once`, `command`, `session`,
    /// `deny`; anything else is a cancelled dialog.
    pub fn parse(s: &str) -> Choice {
        match s {
            "once" => Choice::Once,
            "command" => Choice::Command,
            "session" => Choice::Session,
            "deny" => Choice::Deny,
            _ => Choice::Cancelled,
        }
    }
}

/// What a dialog shows about a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The canonical `host:port` (IPv6 in brackets).
    pub authority: String,
    pub host: String,
    pub port: u16,
    /// The Unicode form of a name with `xn--` labels.
    pub unicode: Option<String>,
    /// That Unicode form mixes Latin letters with letters of another
    /// script in one label, or spells a label wholly in letters of another
    /// script that look like Latin ones (a look-alike of another name,
    /// possibly).
    pub mixed_scripts: bool,
}

impl Request {
    pub fn of(dest: &Destination) -> Request {
        let host = dest.host.to_string();
        let (unicode, mixed_scripts) = match &dest.host {
            Host::Name(n) if n.split('.').any(|l| l.starts_with("xn--")) => {
                let (u, r) = idna::domain_to_unicode(n);
                if r.is_err() || u == *n {
                    (None, false)
                } else {
                    let mixed = u.split('.').any(|l| {
                        let mixes = l.chars().any(is_latin) && l.chars().any(|c| c.is_alphabetic() && !is_latin(c));
                        // A label wholly in letters that look like Latin ones (Cyrillic
                        // `аррӏе`) imitates a Latin name without mixing scripts.
                        let imitates = l.chars().any(char::is_alphabetic)
                            && l.chars().filter(|c| c.is_alphabetic()).all(|c| LATIN_LOOKALIKES.contains(c));
                        mixes || imitates
                    });
                    (Some(u), mixed)
                }
            }
            _ => (None, false),
        };
        Request { authority: dest.authority(), host, port: dest.port, unicode, mixed_scripts }
    }
}

/// Lower-case letters of other scripts that look like Latin ones
/// (Cyrillic, Greek and Armenian; names are lower-cased before this).
const LATIN_LOOKALIKES: &str = "аеорсухѕіјԁһӏԛԝүкьοναιρυχϲϳκօսհոց";

/// A Latin letter: ASCII, Latin-1, Latin Extended-A/B and Additional.
fn is_latin(c: char) -> bool {
    c.is_ascii_alphabetic()
        || (('\u{c0}'..='\u{24f}').contains(&c) && c != '\u{d7}' && c != '\u{f7}')
        || ('\u{1e00}'..='\u{1eff}').contains(&c)
}

/// A dialog in flight.
pub type Asking = Pin<Box<dyn Future<Output = Choice> + Send>>;
/// Opens a dialog about a destination and resolves the user's choice.
pub type Ask = Arc<dyn Fn(Request) -> Asking + Send + Sync>;

/// What a command's review needs from its caller: the dialog (none: no
/// UI) and whether the session is in yolo mode.
#[derive(Clone, Default)]
pub struct Reviewing {
    pub ask: Option<Ask>,
    pub yolo: bool,
}

impl std::fmt::Debug for Reviewing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reviewing").field("ask", &self.ask.is_some()).field("yolo", &self.yolo).finish()
    }
}

/// The destinations allowed for the rest of the session (shared by every
/// command of it).
#[derive(Debug, Clone, Default)]
pub struct SessionGrants(Arc<parking_lot::Mutex<HashSet<Destination>>>);

impl SessionGrants {
    pub fn covers(&self, dest: &Destination) -> bool {
        self.0.lock().contains(dest)
    }

    fn add(&self, dest: &Destination) -> bool {
        let mut g = self.0.lock();
        if g.len() >= MAX_SESSION_GRANTS && !g.contains(dest) {
            return false;
        }
        g.insert(dest.clone());
        true
    }
}

/// A dialog's answer as the connections waiting on it see it; the flag is
/// the one-connection grant, taken by the first connection that swaps it.
type Answer = Option<(Choice, Arc<AtomicBool>)>;

/// One command's review state: its grants and its open dialogs.
pub struct Desk {
    /// Who reviews now: set for a whole command, or per call for a
    /// desk that serves many (see [`Desk::between_calls`]).
    ask: parking_lot::Mutex<Option<Ask>>,
    session: SessionGrants,
    command: parking_lot::Mutex<HashSet<Destination>>,
    pending: parking_lot::Mutex<HashMap<Destination, watch::Receiver<Answer>>>,
    dialogs: parking_lot::Mutex<tokio::task::JoinSet<()>>,
    deadline: Duration,
    /// The running call's session is in yolo mode (a desk that serves many
    /// calls; a command's desk leaves this to its policy).
    yolo: AtomicBool,
}

impl Desk {
    /// A command's desk: `ask` none when no one can review (no UI).
    pub fn new(ask: Option<Ask>, session: SessionGrants) -> Arc<Desk> {
        Desk::with_deadline(ask, session, REVIEW_DEADLINE)
    }

    pub fn with_deadline(ask: Option<Ask>, session: SessionGrants, deadline: Duration) -> Arc<Desk> {
        Arc::new(Desk {
            ask: parking_lot::Mutex::new(ask),
            session,
            command: Default::default(),
            pending: Default::default(),
            dialogs: Default::default(),
            deadline,
            yolo: AtomicBool::new(false),
        })
    }

    /// A call starts on a desk that serves many (the python tool's): its
    /// reviewer (none: no one can review) and whether the session is in
    /// yolo mode.
    pub fn call_starts(&self, reviewing: Reviewing) {
        *self.ask.lock() = reviewing.ask;
        self.yolo.store(reviewing.yolo, Ordering::Release);
    }

    /// The call ended: no one reviews until the next starts, its open
    /// dialogs are cancelled (a waiting connection is refused) and its
    /// grants "for this command" end with it.
    pub fn between_calls(&self) {
        *self.ask.lock() = None;
        self.yolo.store(false, Ordering::Release);
        self.dialogs.lock().abort_all();
        self.pending.lock().clear();
        self.command.lock().clear();
    }

    /// The open dialog about `dest`, or a new one (none: too many open).
    fn waiting_on(self: &Arc<Desk>, ask: &Ask, dest: &Destination) -> Option<watch::Receiver<Answer>> {
        let mut pending = self.pending.lock();
        if let Some(rx) = pending.get(dest) {
            return Some(rx.clone());
        }
        if pending.len() >= MAX_PENDING_DIALOGS {
            return None;
        }
        let (tx, rx) = watch::channel(None);
        pending.insert(dest.clone(), rx.clone());
        let asking = ask(Request::of(dest));
        let (desk, dest, deadline) = (Arc::downgrade(self), dest.clone(), self.deadline);
        let mut dialogs = self.dialogs.lock();
        while dialogs.try_join_next().is_some() {}
        dialogs.spawn(async move {
            let choice = tokio::time::timeout(deadline, asking).await.unwrap_or(Choice::Cancelled);
            let Some(desk) = desk.upgrade() else { return };
            let choice = match choice {
                Choice::Command => {
                    desk.command.lock().insert(dest.clone());
                    Choice::Command
                }
                Choice::Session if !desk.session.add(&dest) => Choice::Cancelled,
                c => c,
            };
            // The entry goes before the answer is sent (a command's grant
            // is already in place): a connection that comes later sees
            // the grant, or opens a dialog of its own.
            desk.pending.lock().remove(&dest);
            let _ = tx.send(Some((choice, Arc::new(AtomicBool::new(true)))));
        });
        Some(rx)
    }
}

impl Drop for Desk {
    fn drop(&mut self) {
        self.dialogs.get_mut().abort_all();
    }
}

impl Reviewer for Arc<Desk> {
    fn granted(&self, dest: &Destination) -> bool {
        self.command.lock().contains(dest) || self.session.covers(dest)
    }

    fn yolo(&self) -> bool {
        self.yolo.load(Ordering::Acquire)
    }

    async fn review(&self, dest: &Destination) -> Review {
        let Some(ask) = self.ask.lock().clone() else { return Review::Unavailable };
        loop {
            if self.granted(dest) {
                return Review::Allowed;
            }
            let Some(mut rx) = self.waiting_on(&ask, dest) else { return Review::Cancelled };
            let answer = match rx.wait_for(Option::is_some).await {
                Ok(a) => a.clone(),
                Err(_) => return Review::Cancelled,
            };
            let Some((choice, once)) = answer else { return Review::Cancelled };
            match choice {
                Choice::Command | Choice::Session => return Review::Allowed,
                Choice::Deny => return Review::Denied,
                Choice::Cancelled => return Review::Cancelled,
                Choice::Once if once.swap(false, Ordering::AcqRel) => return Review::Allowed,
                // Another connection took this dialog's one grant: ask again.
                Choice::Once => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    fn dest(host: &str, port: u16) -> Destination {
        Destination::new(host, port).unwrap()
    }

    /// Answers every dialog with `choice` after `delay`; counts dialogs.
    fn asker(choices: Vec<Choice>, delay: Duration) -> (Ask, Arc<AtomicUsize>) {
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let ask: Ask = Arc::new(move |_r| {
            let n = c.fetch_add(1, Ordering::SeqCst);
            let choice = choices.get(n).copied().unwrap_or(Choice::Deny);
            Box::pin(async move {
                tokio::time::sleep(delay).await;
                choice
            })
        });
        (ask, count)
    }

    async fn parallel(desk: &Arc<Desk>, d: &Destination, n: usize) -> Vec<Review> {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            let (desk, d) = (desk.clone(), d.clone());
            set.spawn(async move { desk.review(&d).await });
        }
        let mut out = Vec::new();
        while let Some(r) = set.join_next().await {
            out.push(r.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn twenty_parallel_connections_to_one_host_share_one_dialog() {
        let (ask, count) = asker(vec![Choice::Command], Duration::from_millis(100));
        let desk = Desk::new(Some(ask), SessionGrants::default());
        let d = dest("example.org", 443);
        let got = parallel(&desk, &d, 20).await;
        assert_eq!(got, vec![Review::Allowed; 20]);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        // The command's grant covers later connections, without a dialog;
        // another port of the same host is reviewed.
        assert_eq!(desk.review(&d).await, Review::Allowed);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(desk.review(&dest("example.org", 80)).await, Review::Denied);
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_denial_refuses_every_connection_waiting_on_it() {
        let (ask, count) = asker(vec![Choice::Deny], Duration::from_millis(100));
        let desk = Desk::new(Some(ask), SessionGrants::default());
        let got = parallel(&desk, &dest("example.org", 443), 20).await;
        assert_eq!(got, vec![Review::Denied; 20]);
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_one_connection_grant_is_used_by_exactly_one() {
        // Three waiting on one dialog: "once" lets one through; the other
        // two share the next dialog, which denies.
        let (ask, count) = asker(vec![Choice::Once, Choice::Deny], Duration::from_millis(100));
        let desk = Desk::new(Some(ask), SessionGrants::default());
        let mut got = parallel(&desk, &dest("example.org", 443), 3).await;
        got.sort_by_key(|r| *r != Review::Allowed);
        assert_eq!(got, vec![Review::Allowed, Review::Denied, Review::Denied]);
        assert_eq!(count.load(Ordering::SeqCst), 2);
        // Nothing was kept: a later connection is reviewed again.
        assert_eq!(desk.review(&dest("example.org", 443)).await, Review::Denied);
        assert_eq!(count.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_session_grant_reaches_the_next_command_a_command_grant_does_not() {
        let session = SessionGrants::default();
        let (ask, _) = asker(vec![Choice::Session, Choice::Command], Duration::ZERO);
        let first = Desk::new(Some(ask), session.clone());
        assert_eq!(first.review(&dest("a.example", 443)).await, Review::Allowed);
        assert_eq!(first.review(&dest("b.example", 443)).await, Review::Allowed);
        let (ask, count) = asker(vec![], Duration::ZERO);
        let next = Desk::new(Some(ask), session);
        assert!(next.granted(&dest("a.example", 443)) && !next.granted(&dest("b.example", 443)));
        assert_eq!(next.review(&dest("b.example", 443)).await, Review::Denied);
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_dialog_past_its_deadline_is_cancelled_and_no_ui_is_unavailable() {
        let (ask, _) = asker(vec![Choice::Session], Duration::from_secs(30));
        let desk = Desk::with_deadline(Some(ask), SessionGrants::default(), Duration::from_millis(100));
        let started = std::time::Instant::now();
        assert_eq!(desk.review(&dest("example.org", 443)).await, Review::Cancelled);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!desk.granted(&dest("example.org", 443)));
        let none = Desk::new(None, SessionGrants::default());
        assert_eq!(none.review(&dest("example.org", 443)).await, Review::Unavailable);
    }

    #[tokio::test]
    async fn open_dialogs_are_bounded_per_command() {
        let (ask, count) = asker(vec![Choice::Deny; 8], Duration::from_millis(300));
        let desk = Desk::new(Some(ask), SessionGrants::default());
        let mut set = tokio::task::JoinSet::new();
        for i in 0..MAX_PENDING_DIALOGS + 2 {
            let desk = desk.clone();
            set.spawn(async move { desk.review(&dest(&format!("h{i}.example"), 443)).await });
        }
        let mut got = Vec::new();
        while let Some(r) = set.join_next().await {
            got.push(r.unwrap());
        }
        assert_eq!(got.iter().filter(|r| **r == Review::Cancelled).count(), 2);
        assert_eq!(count.load(Ordering::SeqCst), MAX_PENDING_DIALOGS);
    }

    #[test]
    fn a_punycode_name_shows_its_unicode_form_and_mixed_scripts() {
        let r = Request::of(&dest("xn--pple-43d.com", 443)); // Cyrillic а + "pple"
        assert_eq!(r.unicode.as_deref(), Some("\u{430}pple.com"));
        assert!(r.mixed_scripts);
        let r = Request::of(&dest("münchen.de", 443));
        assert_eq!(r.unicode.as_deref(), Some("münchen.de"));
        assert!(!r.mixed_scripts, "ü is a Latin letter");
        let r = Request::of(&dest("пример.рф", 443));
        assert!(r.unicode.is_some() && !r.mixed_scripts, "one script throughout");
        // Wholly Cyrillic, every letter a Latin look-alike: "apple" in Cyrillic.
        let r = Request::of(&dest("\u{430}\u{440}\u{440}\u{4cf}\u{435}.com", 443));
        assert_eq!(r.unicode.as_deref(), Some("\u{430}\u{440}\u{440}\u{4cf}\u{435}.com"));
        assert!(r.mixed_scripts, "a whole-script look-alike is flagged");
        let r = Request::of(&dest("\u{3bf}\u{3bd}\u{3b1}.org", 443)); // Greek "ova"
        assert!(r.mixed_scripts);
        let r = Request::of(&dest("example.org", 80));
        assert_eq!((r.unicode, r.mixed_scripts, r.authority.as_str()), (None, false, "example.org:80"));
    }

    #[tokio::test]
    async fn a_desk_across_calls_reviews_only_during_a_call_and_forgets_its_command_grants() {
        let (ask, count) = asker(vec![Choice::Command], Duration::from_millis(10));
        let desk = Desk::new(None, SessionGrants::default());
        let d = dest("example.org", 443);
        assert_eq!(desk.review(&d).await, Review::Unavailable);
        desk.call_starts(Reviewing { ask: Some(ask.clone()), yolo: false });
        assert_eq!(desk.review(&d).await, Review::Allowed);
        assert!(desk.granted(&d));
        desk.between_calls();
        assert!(!desk.granted(&d));
        assert_eq!(desk.review(&d).await, Review::Unavailable);
        assert_eq!(count.load(Ordering::SeqCst), 1);
        // A dialog still open when the call ends is cancelled: its connection is refused.
        let (slow, _) = asker(vec![Choice::Command], Duration::from_secs(30));
        desk.call_starts(Reviewing { ask: Some(slow), yolo: false });
        let waiting = tokio::spawn({
            let (desk, d) = (desk.clone(), d.clone());
            async move { desk.review(&d).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        desk.between_calls();
        let got = tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert_eq!(got, Review::Cancelled);
    }

    #[test]
    fn a_desk_across_calls_is_in_yolo_only_during_a_call_that_started_in_yolo() {
        let desk = Desk::new(None, SessionGrants::default());
        assert!(!desk.yolo());
        desk.call_starts(Reviewing { ask: None, yolo: true });
        assert!(desk.yolo());
        desk.between_calls();
        assert!(!desk.yolo(), "no call runs: nothing is allowed by yolo");
        desk.call_starts(Reviewing { ask: None, yolo: false });
        assert!(!desk.yolo());
    }
}
