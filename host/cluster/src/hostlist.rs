//! Slurm host lists: `n[1-3],gpu[01-02],login` expands to `n1 n2 n3
//! gpu01 gpu02 login`, as `scontrol show hostnames` does, without asking
//! Slurm (so it reads any version's output the same way).

use crate::ClusterError;

/// The most hosts one expression may expand to.
const MAX_HOSTS: usize = 1 << 20;

/// Expands a host list expression into host names, in order.
pub fn expand(expression: &str) -> Result<Vec<String>, ClusterError> {
    let bad = |why: &str| {
        ClusterError::Scheduler(format!("cannot read the host list `{expression}`: {why}"))
    };
    let mut hosts = Vec::new();
    for item in split_top(expression).map_err(|e| bad(&e))? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        expand_item(item, &mut hosts).map_err(|e| bad(&e))?;
        if hosts.len() > MAX_HOSTS {
            return Err(bad("too many hosts"));
        }
    }
    Ok(hosts)
}

/// Splits on commas outside brackets.
fn split_top(text: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in text.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err("nested brackets".into()),
            ']' if depth == 1 => depth = 0,
            ']' => return Err("a `]` without a `[`".into()),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("a `[` without a `]`".into());
    }
    parts.push(&text[start..]);
    Ok(parts)
}

/// Expands one `prefix[ranges]suffix...` item (several bracket groups
/// multiply out).
fn expand_item(item: &str, out: &mut Vec<String>) -> Result<(), String> {
    let Some(open) = item.find('[') else {
        out.push(item.to_string());
        return Ok(());
    };
    let close = item[open..]
        .find(']')
        .map(|i| i + open)
        .ok_or("a `[` without a `]`")?;
    let (prefix, ranges, rest) = (&item[..open], &item[open + 1..close], &item[close + 1..]);
    let mut tails = Vec::new();
    expand_item(rest, &mut tails)?;
    for range in ranges.split(',') {
        let (low, high) = range.split_once('-').unwrap_or((range, range));
        let width = low.len();
        let parse = |n: &str| {
            n.parse::<u64>()
                .map_err(|_| format!("`{range}` is not a number or a range of numbers"))
        };
        let (first, last) = (parse(low)?, parse(high)?);
        if last < first {
            return Err(format!("the range `{range}` runs backwards"));
        }
        if last - first > MAX_HOSTS as u64 {
            return Err("too many hosts".into());
        }
        for n in first..=last {
            for tail in &tails {
                out.push(format!("{prefix}{n:0width$}{tail}"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_lists_padding_and_plain_names() {
        assert_eq!(expand("n[1-3]").unwrap(), ["n1", "n2", "n3"]);
        assert_eq!(
            expand("gpu[01-02,07],login,n5").unwrap(),
            ["gpu01", "gpu02", "gpu07", "login", "n5"]
        );
        assert_eq!(expand("n[9-11]").unwrap(), ["n9", "n10", "n11"]);
        assert_eq!(
            expand("r[1-2]-n[1-2]").unwrap(),
            ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]
        );
        assert!(expand("").unwrap().is_empty());
    }

    #[test]
    fn bad_lists_are_refused_with_the_reason() {
        for (bad, why) in [
            ("n[1-3", "without a `]`"),
            ("n[3-1]", "backwards"),
            ("n[a-b]", "not a number"),
            ("n[[1]]", "nested"),
            ("n[1-99999999999]", "too many"),
        ] {
            let e = expand(bad).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
    }
}
