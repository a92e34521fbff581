//! The plan of one sandbox start: the one walk of the project that finds
//! both what to protect (in a writable mode) and what to mask as a secret
//! (in every mode), and the ordered binds and masks it gives bubblewrap,
//! the directories above each pinned first.

use super::*;

/// What one sandbox start needs from the project.
pub struct StartRequest<'a> {
    /// The canonical project directory.
    pub project: &'a Path,
    pub protected: &'a [Pattern],
    pub secrets: &'a SecretRules,
    pub limits: Limits,
    pub git: &'a HostGit,
    pub sink: Notes,
    pub tainted: Tainted,
    /// The permission mode lets the sandbox write the project.
    pub writable: bool,
    /// Canonical host paths whose secrets stay readable.
    pub unmasked: &'a [PathBuf],
    /// What masks are bound from (needed when there are secret patterns).
    pub sources: Option<&'a MaskSources>,
    /// The secrets earlier starts found (see [`KnownSecrets`]).
    pub known: &'a [Mask],
    /// The (device, inode) of the files earlier starts masked.
    pub known_idents: &'a HashSet<(u64, u64)>,
    /// The host-secret list, masked in the project too.
    pub host: &'a HostSecrets,
    /// The mounts inside the project that the sandbox sees masked whole
    /// (`submounts::masked_ids_in`): the walk passes over them.
    pub masked_mounts: &'a std::collections::BTreeSet<u64>,
}

/// The mounts over the project of one sandbox start.
#[derive(Debug)]
pub struct StartPlan {
    /// A writable project's protection, in mount order (the directories
    /// above nested entries, then the protected entries); empty when the
    /// project is mounted read-only.
    pub binds: Vec<Bind>,
    /// After them, in every mode: in a read-only project the directories
    /// above the masks (read-only, onto themselves), then the masks.
    pub masks: Vec<Bind>,
    /// A writable project's guard.
    pub guard: Option<Guard>,
    /// Why a project the mode lets the sandbox write is mounted read-only.
    pub refused: Option<PlanError>,
    pub report: MaskReport,
    /// The watch that tells when these masks are stale (every mode, when
    /// there are secret patterns).
    pub watch: Option<SecretWatch>,
}

/// Why no sandbox can start: a secret would not be hidden.
#[derive(Debug, thiserror::Error)]
pub enum MaskError {
    #[error("the project cannot be opened to look for secrets: {0}")]
    Open(std::io::Error),
    #[error(
        "the project has {0} entries that look like secrets, more than the {MAX_MASKS} that can be masked; narrow \
         PI_SANDBOX_SECRETS or move them out of the project"
    )]
    TooMany(usize),
    #[error("{rel} looks like a secret but could not be masked: {source}")]
    Bind { rel: String, source: std::io::Error },
    #[error("the secret patterns are set but the session has no empty file to mask them with")]
    NoSources,
}

/// Plan one start: a single walk finds the secrets (masked in every
/// mode) and, in a writable mode, the protected entries. A writable
/// project that cannot be protected is mounted read-only (`refused`) and
/// keeps its masks; a secret that cannot be masked stops the start.
pub fn plan_start(r: StartRequest<'_>) -> Result<StartPlan, MaskError> {
    let masking = !r.secrets.is_empty() || !r.host.is_empty();
    let mut out = StartPlan {
        binds: Vec::new(),
        masks: Vec::new(),
        guard: None,
        refused: None,
        report: MaskReport { off: !masking, complete: true, ..MaskReport::default() },
        watch: None,
    };
    if !masking && !r.writable {
        return Ok(out);
    }
    let tree = match Tree::open(r.project) {
        Ok(t) => t.masking(r.masked_mounts.clone()),
        // Not a directory (or gone): nothing in it to mask; bubblewrap
        // then says what is wrong with the project as it always did.
        Err(e) if masking && !matches!(e.kind(), std::io::ErrorKind::NotADirectory | std::io::ErrorKind::NotFound) => {
            return Err(MaskError::Open(e))
        }
        Err(_) if !r.writable => return Ok(out),
        Err(e) => {
            out.refused = Some(PlanError::Open(e));
            return Ok(out);
        }
    };
    let rules = Rules::new(r.protected, r.limits, r.git);
    let mut watching = masking.then(Watching::new);
    let survey = rules.survey(&tree, r.secrets, r.host, watching.as_mut());
    let summary = survey.summary.clone();
    let mut idents = HashSet::new();
    if masking {
        let mut found = mask_list(&tree, &survey.secrets);
        // What earlier starts found is masked while it is there, also when
        // this walk did not get to it (never through a link).
        for known in r.known {
            let here = matches!(tree.lstat(&known.rel), Ok(Some(st)) if Kind::of(&st) != Kind::Link);
            if here && !found.iter().any(|m| m.rel == known.rel) {
                found.push(known.clone());
            }
        }
        // Other names of a masked file (a hard link) are masked too, as
        // ungrantable as the file when it is a host secret.
        let dirs: HashMap<PathBuf, bool> = found.iter().filter(|m| m.dir).map(|m| (m.rel.clone(), m.host)).collect();
        let files = found.iter().filter(|m| !m.dir).map(|m| (&m.rel, m.host));
        let inside = survey
            .inside
            .iter()
            .filter_map(|rel| rel.ancestors().skip(1).find_map(|a| dirs.get(a)).map(|host| (rel, *host)));
        // A file an earlier start masked, under any name now (renamed).
        let mut linked = !r.known_idents.is_empty();
        idents.extend(r.known_idents.iter().copied());
        let mut host_idents = HashSet::new();
        for (rel, host) in files.chain(inside) {
            if let Ok(Some(st)) = tree.lstat(rel) {
                if Kind::of(&st) == Kind::File {
                    idents.insert(ident(&st));
                    if host {
                        host_idents.insert(ident(&st));
                    }
                    linked |= st.st_nlink > 1;
                }
            }
        }
        if linked {
            for rel in other_names(&tree, &rules, &idents, r.writable) {
                let covered = found.iter().any(|m| rel == m.rel || (m.dir && rel.starts_with(&m.rel)));
                if !covered && crate::secrets::plain(&rel) {
                    let host = matches!(tree.lstat(&rel), Ok(Some(st)) if host_idents.contains(&ident(&st)));
                    found.push(Mask { rel, dir: false, host });
                }
            }
        }
        found.sort_by(|a, b| a.rel.cmp(&b.rel));
        // Nothing inside a masked directory is masked again, except past
        // a path a grant opened alone (see `secrets::holes`).
        out.report = MaskReport::new(&found, r.project, r.unmasked, &survey.secrets_summary, r.limits);
        out.report.idents = idents.iter().copied().collect();
        // Only a real file or directory is opened (never through a link).
        out.report
            .holes
            .retain(|h| matches!(tree.lstat(h), Ok(Some(st)) if matches!(Kind::of(&st), Kind::File | Kind::Dir)));
        let holes = out.report.holes.clone();
        let masked = out.report.masked.clone();
        out.report.masked.retain(|m| !crate::secrets::inside_masked_dir(m, &masked, &holes));
    }
    let masked = out.report.masked.clone();
    let holes = out.report.holes.clone();
    if masked.len() > MAX_MASKS {
        return Err(MaskError::TooMany(masked.len()));
    }
    let mut protected = None;
    if r.writable {
        match check_tainted(&tree, r.project, &r.tainted).and_then(|()| rules.resolve(&tree, survey)) {
            Ok(found) => protected = Some(found),
            Err(e) => out.refused = Some(e),
        }
    }
    let entries = protected.as_ref().map(|f: &Found| f.entries.as_slice()).unwrap_or(&[]);
    let ordered = match binds_with_masks(&tree, entries, &masked, &holes, protected.is_some(), r.sources)? {
        Ok(b) => b,
        Err(e) => {
            // The protection cannot be mounted: read-only, masks kept.
            out.refused = Some(e);
            protected = None;
            // Without protected entries every failure is a mask's (outer).
            binds_with_masks(&tree, &[], &masked, &holes, false, r.sources)?
                .map_err(|e| MaskError::Bind { rel: String::new(), source: std::io::Error::other(e.to_string()) })?
        }
    };
    (out.binds, out.masks) = ordered;
    if let Some(watching) = watching {
        let copy = tree.try_clone().map_err(MaskError::Open)?;
        let (secrets, host) = (r.secrets.clone(), r.host.clone());
        out.watch = Some(SecretWatch::new(
            watching,
            secretwatch::Plan {
                tree: copy,
                rules: rules.clone(),
                secrets,
                leaves: host.leaves(),
                host,
                report: out.report.clone(),
                idents,
                writable: r.writable,
                guarded: protected.as_ref().map(secretwatch::Guarded::of).unwrap_or_default(),
            },
        ));
    }
    if let Some(found) = protected {
        out.guard = Some(guard_of(tree, rules, found, summary, r.sink, r.tainted));
    }
    Ok(out)
}

/// Why a start in a writable mode would mount the project read-only if
/// it were made now (it cannot be protected), from the same walk and
/// checks as [`plan_start`]'s, without its secrets (masks only add to the
/// count of binds) and without a guard or any change to the project;
/// `None` when it can be protected. What the user is told of a change to
/// a writable mode; the start decides again.
pub fn writable_refusal(
    project: &Path,
    patterns: &[Pattern],
    limits: Limits,
    git: &HostGit,
    tainted: &Tainted,
) -> Option<PlanError> {
    // As the start would: past the mounts its masks hide, from the mount
    // table as it is now.
    let masked = crate::submounts::masked_ids_in(&crate::submounts::table(), project);
    let tree = match Tree::open(project) {
        Ok(t) => t.masking(masked),
        Err(e) => return Some(PlanError::Open(e)),
    };
    let rules = Rules::new(patterns, limits, git);
    let survey = rules.survey(&tree, &SecretRules::new(Some("")), &HostSecrets::default(), None);
    let found = match check_tainted(&tree, project, tainted).and_then(|()| rules.resolve(&tree, survey)) {
        Ok(found) => found,
        Err(e) => return Some(e),
    };
    match binds_with_masks(&tree, &found.entries, &[], &[], true, None) {
        Ok(Ok(_)) | Err(_) => None,
        Ok(Err(e)) => Some(e),
    }
}

/// Files of the project whose (device, inode) is one of `idents`: where
/// the start's walk goes and, when the sandbox can write the project, in
/// the dependency trees it skips (a hard link made there reads the
/// secret). Links are never followed; bounded like the walk.
fn other_names(tree: &Tree, rules: &Rules, idents: &HashSet<Ident>, writable: bool) -> Vec<PathBuf> {
    let mut out = Vec::new();
    scan::walk(tree, rules.limits, |rel, kind| {
        let Some(name) = rel.file_name() else { return Visit::Descend };
        if rules.protects(tree, rel, name) {
            return Visit::Skip;
        }
        match kind {
            Kind::Dir if !writable && name.to_str().is_some_and(|n| scan::DEPENDENCY_DIRS.contains(&n)) => Visit::Skip,
            Kind::File => {
                if matches!(tree.lstat(rel), Ok(Some(st)) if idents.contains(&ident(&st))) && out.len() < MAX_MASKS {
                    out.push(rel.to_path_buf());
                }
                Visit::Skip
            }
            _ => Visit::Descend,
        }
    });
    out
}

/// The masks for the secrets a walk found: a directory by an empty
/// directory, anything else by an empty file, a link by masking its
/// target when that is in the project (opened beneath it, never through
/// another link). Nothing inside a masked directory is masked again.
pub(super) fn mask_list(tree: &Tree, found: &[(PathBuf, Kind, bool)]) -> Vec<Mask> {
    let mut out: Vec<Mask> = Vec::new();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    for (rel, kind, host) in found {
        let (rel, kind) = match kind {
            Kind::Link => {
                let Ok(target) = tree.read_link(rel) else { continue };
                let Some(t) = inside(tree.path(), rel.parent().unwrap_or(Path::new("")), &target) else { continue };
                match tree.lstat(&t) {
                    Ok(Some(st)) if Kind::of(&st) != Kind::Link => (t, Kind::of(&st)),
                    _ => continue,
                }
            }
            k => (rel.clone(), *k),
        };
        if crate::secrets::plain(&rel) && seen.insert(rel.clone()) {
            out.push(Mask { rel, dir: kind == Kind::Dir, host: *host });
        }
    }
    out.sort_by(|a, b| a.rel.cmp(&b.rel));
    out
}

/// The ordered binds of a start: the directories above every protected
/// entry and mask (onto themselves, shallowest first, read-only unless
/// `writable`), the protected entries, then the masks. Returns
/// (protection, masks); a protected entry that cannot be bound is the
/// inner error (the project is then mounted read-only), a mask the outer.
#[allow(clippy::type_complexity)]
fn binds_with_masks(
    tree: &Tree,
    entries: &[(PathBuf, Kind, Ident)],
    masks: &[Mask],
    holes: &[PathBuf],
    writable: bool,
    sources: Option<&MaskSources>,
) -> Result<Result<(Vec<Bind>, Vec<Bind>), PlanError>, MaskError> {
    let all: HashSet<&PathBuf> = entries.iter().filter(|(_, k, _)| *k != Kind::Link).map(|(r, _, _)| r).collect();
    let mut outer: Vec<&PathBuf> =
        all.iter().copied().filter(|e| !e.ancestors().skip(1).any(|a| all.contains(&a.to_path_buf()))).collect();
    outer.sort();
    let mut anchors: HashSet<PathBuf> = HashSet::new();
    for rel in outer.iter().map(|e| e.as_path()).chain(masks.iter().map(|m| m.rel.as_path())) {
        for a in rel.ancestors().skip(1).filter(|p| !p.as_os_str().is_empty()) {
            anchors.insert(a.to_path_buf());
        }
    }
    let mut anchors: Vec<PathBuf> = anchors.into_iter().collect();
    anchors.sort_by(|a, b| a.components().count().cmp(&b.components().count()).then(a.cmp(b)));
    let total = anchors.len() + outer.len() + masks.len() + holes.len();
    if total > MAX_BINDS {
        if outer.is_empty() {
            return Err(MaskError::TooMany(masks.len()));
        }
        return Ok(Err(PlanError::Unprotectable(format!(
            "the project has {total} protected entries, secret masks and directories above them, more than the \
             {MAX_BINDS} that can be mounted"
        ))));
    }
    let mut protection = Vec::new();
    for (rel, read_only) in anchors.iter().map(|a| (a, !writable)).chain(outer.iter().map(|e| (*e, true))) {
        match tree.open_at(rel, OFlag::O_PATH) {
            Ok(fd) => protection.push(Bind { fd, rel: rel.clone(), read_only }),
            Err(e) if outer.is_empty() => {
                return Err(MaskError::Bind { rel: crate::display::one_line(&rel).to_string(), source: e });
            }
            Err(e) => {
                return Ok(Err(PlanError::Unprotectable(format!(
                    "{} could not be protected: {e}",
                    crate::display::one_line(&rel)
                ))))
            }
        }
    }
    let sources = if masks.is_empty() { None } else { Some(sources.ok_or(MaskError::NoSources)?) };
    let mut hidden = Vec::new();
    let bind_error = |rel: &Path| {
        let rel = crate::display::one_line(rel).to_string();
        move |source| MaskError::Bind { rel, source }
    };
    // In path order: a directory with holes (from a copy of its shape with
    // just the holes in it), each hole (the real entry, read-only), the
    // masks past a hole.
    let mut order: Vec<(&Path, Option<&Mask>)> =
        masks.iter().map(|m| (m.rel.as_path(), Some(m))).chain(holes.iter().map(|h| (h.as_path(), None))).collect();
    order.sort_by(|a, b| a.0.cmp(b.0));
    for (rel, mask) in order {
        let fd = match mask {
            Some(m) => {
                let sources = sources.ok_or(MaskError::NoSources)?;
                let inside: Vec<(PathBuf, bool)> = holes
                    .iter()
                    .filter(|h| m.dir && h.starts_with(&m.rel) && **h != m.rel)
                    .map(|h| {
                        let dir = matches!(tree.lstat(h), Ok(Some(st)) if Kind::of(&st) == Kind::Dir);
                        (h.strip_prefix(&m.rel).unwrap_or(h).to_path_buf(), dir)
                    })
                    .collect();
                if inside.is_empty() { sources.open(m.dir) } else { sources.shaped(&inside) }
                    .map_err(bind_error(rel))?
            }
            None => tree.open_at(rel, OFlag::O_PATH).map_err(bind_error(rel))?,
        };
        hidden.push(Bind { fd, rel: rel.to_path_buf(), read_only: true });
    }
    if writable {
        return Ok(Ok((protection, hidden)));
    }
    protection.extend(hidden);
    Ok(Ok((Vec::new(), protection)))
}

#[cfg(test)]
mod tests {
    use super::super::tests::tmp;
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_secret_that_appears_after_the_plan_makes_it_stale() {
        use std::os::unix::fs::symlink;
        let fresh = || {
            let p = tmp();
            std::fs::create_dir_all(p.join(".session")).expect("mkdir");
            std::fs::create_dir_all(p.join("project/src")).expect("mkdir");
            std::fs::create_dir_all(p.join("project/node_modules/pkg")).expect("mkdir");
            std::fs::write(p.join("project/.env"), "S").expect("write");
            std::fs::write(p.join("project/.env.example"), "E").expect("write");
            p
        };
        type Act = fn(&Path);
        let cases: [(&str, Act, bool); 9] = [
            ("an innocuous file", |d| std::fs::write(d.join("src/a.py"), "").expect("w"), false),
            ("an example", |d| std::fs::write(d.join("src/.env.example"), "").expect("w"), false),
            ("inside a dependency tree", |d| std::fs::write(d.join("node_modules/pkg/.env"), "").expect("w"), false),
            (
                ".env.local",
                |d| std::fs::copy(d.join(".env.example"), d.join(".env.local")).map(|_| ()).expect("cp"),
                true,
            ),
            (
                "a renamed file",
                |d| {
                    std::fs::write(d.join("src/x"), "").expect("w");
                    std::fs::rename(d.join("src/x"), d.join("src/key.pem")).expect("mv")
                },
                true,
            ),
            ("a secrets directory", |d| std::fs::create_dir(d.join("src/secrets")).expect("mkdir"), true),
            (
                "a new directory, then a secret in it",
                |d| {
                    std::fs::create_dir_all(d.join("new/deep")).expect("mkdir");
                    std::fs::write(d.join("new/deep/id_rsa"), "").expect("w")
                },
                true,
            ),
            (
                "a hard link of a masked file",
                |d| std::fs::hard_link(d.join(".env"), d.join("src/notes.txt")).expect("ln"),
                true,
            ),
            ("a link named like a secret", |d| symlink("../.env.example", d.join("src/.env.prod")).expect("ln"), true),
        ];
        for (what, act, stale) in cases {
            let p = fresh();
            let mut plan = start(&p, false, &[], None, scan::DEFAULT_LIMITS);
            let watch = plan.watch.take().expect("a watch in read-only mode");
            assert!(watch.watches() >= 2, "{what}: the project and src/ are watched");
            assert_eq!(watch.stale(), None, "{what}: nothing appeared yet");
            act(&p.join("project"));
            assert_eq!(watch.stale().is_some(), stale, "{what}: {:?}", watch.stale());
            std::fs::remove_dir_all(&p).expect("cleanup");
        }
    }

    #[test]
    fn a_writable_walk_is_kept_through_ordinary_changes_and_new_protected_names_are_judged() {
        let fresh = || {
            let p = tmp();
            for d in [".session", "project/src/a", "project/.git/hooks"] {
                std::fs::create_dir_all(p.join(d)).expect("mkdir");
            }
            std::fs::write(p.join("project/.git/config"), "[core]\n").expect("write");
            std::fs::write(p.join("project/src/a/f.py"), "").expect("write");
            p
        };
        fn mkdirs(d: &Path, rel: &str) {
            std::fs::create_dir_all(d.join(rel)).expect("mkdir")
        }
        fn write(d: &Path, rel: &str) {
            std::fs::write(d.join(rel), "x").expect("write")
        }
        type Act = fn(&Path);
        // What happens; whether the walk is kept between commands (the
        // host did it) and at the end of a command (the guard first makes
        // new protected names inert); the name made inert.
        let cases: [(&str, Act, bool, bool, Option<&str>); 9] = [
            ("a file made", |d| write(d, "src/a/x"), true, true, None),
            ("a file removed", |d| std::fs::remove_file(d.join("src/a/f.py")).expect("rm"), true, true, None),
            (
                "a tree made",
                |d| {
                    mkdirs(d, "src/b/c");
                    write(d, "src/b/c/g.py")
                },
                true,
                true,
                None,
            ),
            ("a tree removed", |d| std::fs::remove_dir_all(d.join("src/a")).expect("rm"), true, true, None),
            (
                "an .envrc deep in a new tree",
                |d| {
                    mkdirs(d, "src/n/m");
                    write(d, "src/n/m/.envrc")
                },
                false,
                true,
                Some("src/n/m/.envrc"),
            ),
            ("a repository", |d| mkdirs(d, "src/a/.git/hooks"), false, true, Some("src/a/.git")),
            (
                "a pi skill",
                |d| {
                    mkdirs(d, "src/skills/x");
                    write(d, "src/skills/x/SKILL.md")
                },
                false,
                true,
                Some("src/skills"),
            ),
            (
                "the repository moved away",
                |d| std::fs::rename(d.join(".git"), d.join("old")).expect("mv"),
                false,
                false,
                None,
            ),
            (
                "git's configuration replaced",
                |d| {
                    write(d, ".git/config.lock");
                    std::fs::rename(d.join(".git/config.lock"), d.join(".git/config")).expect("mv")
                },
                false,
                false,
                None,
            ),
        ];
        for (what, act, between, at_end, inert) in cases {
            let p = fresh();
            let d = p.join("project");
            let mut plan = start(&p, true, &[], None, scan::DEFAULT_LIMITS);
            let (watch, guard) = (plan.watch.take().expect("a watch"), plan.guard.take().expect("writable"));
            let planned = |rels: &[PathBuf]| rels.iter().all(|r| guard.as_planned(r));
            assert!(watch.protection_kept(planned), "{what}: nothing happened yet");
            act(&d);
            assert_eq!(watch.protection_kept(planned), between, "{what}: between commands");
            assert_eq!(watch.protection_kept(|rels| guard.settle_named(rels)), at_end, "{what}: at the end");
            if let Some(rel) = inert {
                assert!(!d.join(rel).exists(), "{what}: {rel} is left");
                assert!(d.join(format!("{rel}{INERT_MARK}")).exists(), "{what}: {rel} was not made inert");
                // The guard's own renames keep the walk.
                assert!(watch.protection_kept(planned), "{what}: after the renames");
            }
            std::fs::remove_dir_all(&p).expect("cleanup");
        }
    }

    #[test]
    fn the_periodic_check_reads_the_secret_watch_instead_of_walking() {
        let p = tmp();
        std::fs::create_dir_all(p.join(".session")).expect("mkdir");
        std::fs::create_dir_all(p.join("project/sub/deep")).expect("mkdir");
        let d = p.join("project");
        let small = Limits { max_entries: 64, max_depth: 24 };
        let mut plan = start(&p, true, &[], None, small);
        let (watch, guard) = (plan.watch.take().expect("a watch"), plan.guard.take().expect("writable"));
        let unfollowed = start(&p, true, &[], None, small).guard.expect("writable");
        // Past the walk's bound since: a walk would stop the sandbox.
        for i in 0..80 {
            std::fs::write(d.join(format!("sub/junk{i}")), "").expect("write");
        }
        std::fs::write(d.join("sub/deep/.yarnrc.yml"), "planted").expect("write");
        guard.follow(std::sync::Arc::new(watch));
        guard.check_periodic();
        let notes = guard.pending.lock().take().join("\n");
        assert!(notes.contains("sub/deep/.yarnrc.yml appeared"), "{notes}");
        assert!(!notes.contains("grew past"), "the project was walked: {notes}");
        assert_eq!(std::fs::read_to_string(d.join("sub/deep/.yarnrc.yml.pi-inert")).expect("inert"), "planted");
        // Baseline, a guard without the watch: the whole walk, which finds the project outgrown.
        unfollowed.check_periodic();
        let notes = unfollowed.pending.lock().take().join("\n");
        assert!(notes.contains("grew past 64 entries"), "{notes}");
        std::fs::remove_dir_all(&p).expect("cleanup");
    }

    #[test]
    fn hard_links_of_a_masked_file_are_masked_and_dependency_trees_only_when_writable() {
        let p = tmp();
        std::fs::create_dir_all(p.join(".session")).expect("mkdir");
        std::fs::create_dir_all(p.join("project/docs")).expect("mkdir");
        std::fs::create_dir_all(p.join("project/node_modules/pkg")).expect("mkdir");
        std::fs::create_dir_all(p.join("project/secrets")).expect("mkdir");
        std::fs::write(p.join("project/.env"), "S").expect("write");
        std::fs::write(p.join("project/secrets/api"), "K").expect("write");
        std::fs::write(p.join("project/docs/plain.txt"), "P").expect("write");
        std::fs::hard_link(p.join("project/.env"), p.join("project/docs/notes.txt")).expect("ln");
        std::fs::hard_link(p.join("project/secrets/api"), p.join("project/docs/api.txt")).expect("ln");
        std::fs::hard_link(p.join("project/.env"), p.join("project/node_modules/pkg/index.js")).expect("ln");
        // A link count above one alone is not a secret (git, cargo, pnpm).
        std::fs::hard_link(p.join("project/docs/plain.txt"), p.join("project/docs/plain2.txt")).expect("ln");
        let rels =
            |plan: &StartPlan| plan.report.masked.iter().map(|m| m.rel.display().to_string()).collect::<Vec<_>>();
        let ro = start(&p, false, &[], None, scan::DEFAULT_LIMITS);
        assert_eq!(rels(&ro), [".env", "docs/api.txt", "docs/notes.txt", "secrets"]);
        let rw = start(&p, true, &[], None, scan::DEFAULT_LIMITS);
        assert_eq!(rels(&rw), [".env", "docs/api.txt", "docs/notes.txt", "node_modules/pkg/index.js", "secrets"]);
        std::fs::remove_dir_all(&p).expect("cleanup");
    }

    /// What the watch costs: one inotify watch per directory walked
    /// (`cargo test --locked watch_budget -- --ignored --nocapture`).
    #[test]
    #[ignore]
    fn watch_budget_of_a_large_project() {
        let p = tmp();
        std::fs::create_dir_all(p.join(".session")).expect("mkdir");
        for d in 0..1000 {
            let dir = p.join(format!("project/d{d:04}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            for f in 0..20 {
                std::fs::write(dir.join(format!("f{f}.py")), "").expect("write");
            }
        }
        for with in [false, true] {
            let began = std::time::Instant::now();
            let plan = start(&p, false, &[], if with { None } else { Some("") }, scan::DEFAULT_LIMITS);
            let took = began.elapsed();
            let watches = plan.watch.as_ref().map(|w| w.watches()).unwrap_or(0);
            println!(
                "20,000 files in 1,000 directories, masks {}: plan {took:?}, {watches} inotify watches",
                if with { "on" } else { "off" }
            );
        }
        // The walk alone, with and without the watches.
        let tree = Tree::open(&p.join("project")).expect("open");
        let rules = Rules::new(&patterns(None), scan::DEFAULT_LIMITS, &HostGit::default());
        let secrets = SecretRules::new(None);
        for round in 0..3 {
            let began = std::time::Instant::now();
            rules.survey(&tree, &secrets, &HostSecrets::default(), None);
            let bare = began.elapsed();
            let began = std::time::Instant::now();
            let mut w = Watching::new();
            rules.survey(&tree, &secrets, &HostSecrets::default(), Some(&mut w));
            println!("round {round}: walk {bare:?}, walk with watches {:?} ({} watches)", began.elapsed(), w.watches());
        }
        std::fs::remove_dir_all(&p).expect("cleanup");
    }

    fn start(p: &Path, writable: bool, unmasked: &[PathBuf], secrets: Option<&str>, limits: Limits) -> StartPlan {
        start_knowing(p, writable, unmasked, secrets, limits, &[])
    }

    fn start_knowing(
        p: &Path,
        writable: bool,
        unmasked: &[PathBuf],
        secrets: Option<&str>,
        limits: Limits,
        known: &[Mask],
    ) -> StartPlan {
        let sources = MaskSources::in_dir(&p.join(".session")).expect("sources");
        plan_start(StartRequest {
            project: &p.join("project"),
            protected: &patterns(None),
            secrets: &SecretRules::new(secrets),
            limits,
            git: &HostGit::default(),
            sink: Notes::default(),
            tainted: Tainted::default(),
            writable,
            unmasked,
            sources: Some(&sources),
            known,
            known_idents: &HashSet::new(),
            host: &HostSecrets::default(),
            masked_mounts: &Default::default(),
        })
        .expect("plan")
    }

    #[test]
    fn a_secret_an_earlier_start_found_stays_masked_past_the_walks_bound() {
        let base = tmp();
        std::fs::create_dir_all(base.join(".session")).expect("mkdir");
        let p = base.join("project");
        std::fs::create_dir_all(p.join("sub")).expect("mkdir");
        std::fs::write(p.join("sub/.env.production"), "secret").expect("write");
        let first = start(&base, true, &[], None, scan::DEFAULT_LIMITS);
        let known = first.report.masked.clone();
        assert_eq!(known, [Mask { rel: "sub/.env.production".into(), dir: false, host: false }]);
        // A writable sandbox fills the project root so that the walk stops before sub/.
        for i in 0..40 {
            std::fs::write(p.join(format!("junk{i}")), "").expect("write");
        }
        let small = Limits { max_entries: 20, max_depth: 24 };
        let baseline = start(&base, true, &[], None, small);
        assert!(!baseline.report.complete && baseline.report.masked.is_empty(), "baseline: the walk missed it");
        let later = start_knowing(&base, true, &[], None, small, &known);
        assert_eq!(later.report.masked, known, "what an earlier start found is masked again");
        // Gone, or a link now: not masked (nothing to hide; never through a link).
        std::fs::remove_file(p.join("sub/.env.production")).expect("rm");
        symlink("/etc/hostname", p.join("sub/.env.production")).expect("link");
        assert!(start_knowing(&base, true, &[], None, small, &known).report.masked.is_empty());
        std::fs::remove_dir_all(&base).expect("cleanup");
    }

    fn bound(binds: &[Bind]) -> Vec<(String, bool)> {
        binds.iter().map(|b| (b.rel.to_string_lossy().into_owned(), b.read_only)).collect()
    }

    #[test]
    fn one_walk_masks_secrets_in_every_mode_with_the_directories_above_pinned() {
        let base = tmp();
        std::fs::create_dir_all(base.join(".session")).expect("mkdir");
        let p = base.join("project");
        for d in ["sub", "deploy", "secrets/b", "node_modules/x", "config", ".git"] {
            std::fs::create_dir_all(p.join(d)).expect("mkdir");
        }
        for f in
            [".env", "sub/.env.production", "deploy/key.pem", ".env.example", "secrets/b/.env", "node_modules/x/k.pem"]
        {
            std::fs::write(p.join(f), "secret").expect("write");
        }
        std::fs::write(p.join("config/netrc-real"), "machine x password y").expect("write");
        symlink("config/netrc-real", p.join(".netrc")).expect("link");
        let all = scan::DEFAULT_LIMITS;
        let ro = start(&base, false, &[], None, all);
        assert!(ro.binds.is_empty() && ro.guard.is_none() && ro.refused.is_none());
        let masks = [".env", "config/netrc-real", "deploy/key.pem", "secrets", "sub/.env.production"];
        let expected: Vec<(String, bool)> =
            ["config", "deploy", "sub"].iter().chain(&masks).map(|r| (r.to_string(), true)).collect();
        assert_eq!(bound(&ro.masks), expected, "anchors read-only, then the masks; nothing in node_modules");
        assert_eq!(ro.report.masked.iter().map(|m| m.rel.to_string_lossy().into_owned()).collect::<Vec<_>>(), masks);
        assert!(ro.report.masked.iter().any(|m| m.rel == Path::new("secrets") && m.dir));
        assert!(ro.report.complete && ro.report.incomplete_note().is_none());
        // Writable: the anchors are writable mount points with the protection; the masks follow.
        let rw = start(&base, true, &[], None, all);
        let prot = bound(&rw.binds);
        for b in [("config", false), ("deploy", false), ("sub", false), (".git", true)] {
            assert!(prot.contains(&(b.0.to_string(), b.1)), "{b:?} not in {prot:?}");
        }
        assert_eq!(bound(&rw.masks), masks.iter().map(|r| (r.to_string(), true)).collect::<Vec<_>>());
        assert!(rw.guard.is_some());
        // The unmask set: a directory, or exactly one file.
        let sub = start(&base, false, &[p.join("sub")], None, all);
        assert!(!bound(&sub.masks).iter().any(|(r, _)| r.starts_with("sub")), "{:?}", bound(&sub.masks));
        assert_eq!(sub.report.unmasked, [Mask { rel: "sub/.env.production".into(), dir: false, host: false }]);
        let one = start(&base, false, &[p.join(".env")], None, all);
        assert_eq!(bound(&one.masks).len(), expected.len() - 1);
        assert!(!bound(&one.masks).contains(&(".env".into(), true)));
        assert_eq!(one.report.host_paths(&p).len(), masks.len(), "an unmasked secret is still known");
        // Over the bound: what was found is masked, and the report says so.
        let small = start(&base, true, &[], None, Limits { max_entries: 9, max_depth: 24 });
        assert!(!small.report.complete && small.report.entries == 9);
        assert!(small.report.masked.iter().any(|m| m.rel == Path::new(".env")));
        assert!(small.refused.is_some() && small.binds.is_empty(), "an incomplete walk leaves the project read-only");
        assert!(small.masks.iter().all(|b| b.read_only));
        // Masking off in a read-only mode: no walk at all.
        let off = start(&base, false, &[], Some(""), all);
        assert!(off.report.off && off.masks.is_empty() && off.report.entries == 0);
        std::fs::remove_dir_all(&base).expect("cleanup");
    }

    #[test]
    fn the_writable_refusal_is_the_starts() {
        let base = tmp();
        std::fs::create_dir_all(base.join(".session")).expect("mkdir");
        let p = base.join("project");
        std::fs::create_dir_all(p.join(".git")).expect("mkdir");
        for i in 0..20 {
            std::fs::write(p.join(format!("f{i}")), "").expect("write");
        }
        let refusal = |limits: Limits| {
            writable_refusal(&p, &patterns(None), limits, &HostGit::default(), &Tainted::default())
                .map(|e| e.to_string())
        };
        // Past the bound: the same reason as a writable start's, and the
        // project is left as it was (no guard, no change).
        let small = Limits { max_entries: 5, max_depth: 24 };
        let said = refusal(small).expect("past the bound");
        assert!(said.contains("more than 5 entries"), "{said}");
        assert_eq!(start(&base, true, &[], Some(""), small).refused.map(|e| e.to_string()), Some(said));
        // Within it: protectable, as the start finds.
        assert_eq!(refusal(scan::DEFAULT_LIMITS), None);
        assert!(start(&base, true, &[], Some(""), scan::DEFAULT_LIMITS).refused.is_none());
        // A protected name an earlier sandbox left makes it unprotectable.
        let tainted = Tainted::default();
        tainted.lock().push(PathBuf::from("f0"));
        let said = writable_refusal(&p, &patterns(None), scan::DEFAULT_LIMITS, &HostGit::default(), &tainted)
            .expect("tainted")
            .to_string();
        assert!(said.contains("could not be made inert"), "{said}");
        std::fs::remove_dir_all(&base).expect("cleanup");
    }
}
