//! The policy as the markdown tables of `docs/security.md`, rendered from
//! the lists themselves.

use super::*;

/// The policy as the markdown tables of `docs/security.md`: the allowed
/// groups with their reasons, then every refusal with its answer and its
/// reason, then the default. Rules with one answer and one reason share a
/// row, and a call's conditions are written as comparisons of its
/// arguments (single-bit tests on one argument merged into one mask).
/// `tests/docs.rs` fails when the document's copy differs from this.
pub fn markdown_table(allowed: &[Allowed], rules: &[Rule]) -> String {
    fn cell(text: &str) -> String {
        text.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
    }
    fn answer(action: Action) -> &'static str {
        match action {
            Action::Eperm => "EPERM",
            Action::Enosys => "ENOSYS",
        }
    }
    let calls = allowed.iter().map(|a| a.names.len()).sum::<usize>();
    let mut out = format!(
        "{calls} calls allowed in {} groups; {} rules refuse a call, or a call with some arguments; every \
         other call answers {}.\n\n",
        allowed.len(),
        rules.len(),
        answer(DEFAULT)
    );
    out.push_str("| allowed | why |\n| --- | --- |\n");
    for a in allowed {
        let names: Vec<String> = a.names.iter().map(|n| format!("`{n}`")).collect();
        let optional = if a.required { "" } else { " (where the architecture and libseccomp have them)" };
        out.push_str(&format!("| {}{optional} | {} |\n", names.join(", "), cell(a.reason)));
    }
    // Rows keyed by (answer, reason), calls in order of first appearance,
    // each call with the conditions of its rules.
    type Calls<'a> = Vec<(&'a str, Vec<When>)>;
    let mut rows: Vec<(Action, &str, Calls)> = Vec::new();
    for r in rules {
        let row = match rows.iter_mut().position(|(a, why, _)| *a == r.action && *why == r.reason) {
            Some(i) => &mut rows[i],
            None => {
                rows.push((r.action, r.reason, Vec::new()));
                let last = rows.len() - 1;
                &mut rows[last]
            }
        };
        match row.2.iter_mut().find(|(name, _)| *name == r.syscall) {
            Some((_, whens)) => whens.push(r.when),
            None => row.2.push((r.syscall, vec![r.when])),
        }
    }
    out.push_str("\n| refused | answer | why |\n| --- | --- | --- |\n");
    for (action, why, calls) in rows {
        let calls: Vec<String> = calls
            .iter()
            .map(|(name, whens)| match conditions_text(whens) {
                None => format!("`{name}`"),
                Some(when) => format!("`{name}` when {when}"),
            })
            .collect();
        out.push_str(&format!("| {} | {} | {} |\n", calls.join("; "), answer(action), cell(why)));
    }
    out
}

/// The conditions of one call's rules (any of them refuses it), or `None`
/// when one applies always.
fn conditions_text(whens: &[When]) -> Option<String> {
    let atoms = |w: &When| -> Option<Vec<Cmp>> {
        match *w {
            When::Always => None,
            When::ArgMasked { arg, mask, value } => Some(vec![Cmp::Masked { arg, mask, value }]),
            When::ArgNot { arg, value } => Some(vec![Cmp::Not { arg, value }]),
            When::Both(a, b) => Some(vec![a, b]),
        }
    };
    let conjunctions: Vec<Vec<Cmp>> = whens.iter().map(atoms).collect::<Option<_>>()?;
    let bit = |c: &Cmp| match *c {
        Cmp::Masked { arg, mask, value } if mask == value && mask.count_ones() == 1 => Some((arg, mask)),
        _ => None,
    };
    // Every conjunction tests one bit per position, each position one
    // argument, and together they are every combination: one mask each.
    let width = conjunctions[0].len();
    let mut merged = Vec::new();
    for i in 0..width {
        let bits: Option<Vec<(u32, u64)>> = conjunctions.iter().map(|c| c.get(i).and_then(bit)).collect();
        match bits {
            Some(bits) if bits.iter().all(|(arg, _)| *arg == bits[0].0) => {
                let mut masks: Vec<u64> = bits.iter().map(|(_, m)| *m).collect();
                masks.sort_unstable();
                masks.dedup();
                merged.push((bits[0].0, masks));
            }
            _ => break,
        }
    }
    let combinations: usize = merged.iter().map(|(_, m)| m.len()).product();
    if merged.len() == width && conjunctions.iter().all(|c| c.len() == width) && combinations == conjunctions.len() {
        let parts: Vec<String> = merged
            .iter()
            .map(|(arg, masks)| format!("arg{arg} & {:#x} != 0", masks.iter().fold(0, |a, m| a | m)))
            .collect();
        return Some(parts.join(" and "));
    }
    let cmp = |c: &Cmp| match *c {
        Cmp::Masked { arg, mask: 0xffff_ffff, value } => format!("arg{arg} == {value:#x}"),
        Cmp::Masked { arg, mask, value } if mask == value => format!("arg{arg} & {mask:#x} != 0"),
        Cmp::Masked { arg, mask, value } => format!("arg{arg} & {mask:#x} == {value:#x}"),
        Cmp::Not { arg, value } => format!("arg{arg} != {value:#x}"),
    };
    let parts: Vec<String> = conjunctions.iter().map(|c| c.iter().map(cmp).collect::<Vec<_>>().join(" and ")).collect();
    Some(parts.join(", or "))
}
