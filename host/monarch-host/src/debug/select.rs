//! The commands of the `monarch_dbg>` prompt and their `ranks(...)`
//! selections.
//!
//! A selection picks ranks of one actor mesh: by flat rank (`ranks(1,3)`,
//! `ranks(0:4)`, `ranks(0:8:2)`), by dimension (`ranks(hosts=1,
//! gpus=0:2)`, a dimension left out is every index of it), or all
//! (`ranks(*)`). Ranges are half-open, as Python's. Mesh names may hold
//! any character but whitespace (`-` and `.` included).

/// One index or range of a selection: `N`, `A:B`, `A:B:S`, or `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Range {
    /// Every index.
    All,
    /// `start..end` (exclusive; None: to the end) by `step`.
    Span {
        /// The first index.
        start: u32,
        /// The end (exclusive); None: no end.
        end: Option<u32>,
        /// The step (at least 1).
        step: u32,
    },
}

impl Range {
    fn parse(text: &str) -> Result<Range, String> {
        let text = text.trim();
        if text == "*" || text == ":" {
            return Ok(Range::All);
        }
        let number = |part: &str, what: &str| -> Result<Option<u32>, String> {
            let part = part.trim();
            if part.is_empty() {
                return Ok(None);
            }
            part.parse::<u32>()
                .map(Some)
                .map_err(|_| format!("`{part}` is not a {what} (a whole number)"))
        };
        let parts: Vec<&str> = text.split(':').collect();
        match parts.as_slice() {
            [one] => {
                let at = number(one, "rank")?.ok_or("an empty rank")?;
                Ok(Range::Span {
                    start: at,
                    end: Some(at + 1),
                    step: 1,
                })
            }
            [start, end] | [start, end, _] => {
                let step = match parts.get(2) {
                    Some(step) => number(step, "step")?.unwrap_or(1),
                    None => 1,
                };
                if step == 0 {
                    return Err(format!("`{text}`: a step of 0 selects nothing"));
                }
                let start = number(start, "start")?.unwrap_or(0);
                let end = number(end, "end")?;
                if end.is_some_and(|end| end <= start) {
                    return Err(format!("`{text}` is empty: its end is not after its start"));
                }
                Ok(Range::Span { start, end, step })
            }
            _ => Err(format!("`{text}` is not N, A:B or A:B:S")),
        }
    }

    fn contains(&self, at: u32) -> bool {
        match self {
            Range::All => true,
            Range::Span { start, end, step } => {
                at >= *start && end.is_none_or(|end| at < end) && (at - start).is_multiple_of(*step)
            }
        }
    }
}

impl std::fmt::Display for Range {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Range::All => f.write_str("*"),
            Range::Span {
                start,
                end: Some(end),
                step: 1,
            } if *end == start + 1 => write!(f, "{start}"),
            Range::Span { start, end, step } => {
                let end = end.map(|e| e.to_string()).unwrap_or_default();
                match step {
                    1 => write!(f, "{start}:{end}"),
                    step => write!(f, "{start}:{end}:{step}"),
                }
            }
        }
    }
}

/// Which ranks of a mesh a command goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// Flat ranks: any of these.
    Ranks(Vec<Range>),
    /// Coordinates: each named dimension within its range.
    Dims(Vec<(String, Range)>),
}

impl Selection {
    /// Parses the inside of `ranks(...)`.
    pub fn parse(inside: &str) -> Result<Selection, String> {
        let inside = inside.trim();
        if inside.is_empty() {
            return Err("`ranks()` selects nothing; use ranks(*) for all".into());
        }
        let items: Vec<&str> = inside.split(',').map(str::trim).collect();
        let named = items.iter().filter(|item| item.contains('=')).count();
        if named == 0 {
            let ranges = items
                .iter()
                .map(|item| Range::parse(item))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(Selection::Ranks(ranges));
        }
        if named != items.len() {
            return Err(format!(
                "`ranks({inside})` mixes flat ranks and dimensions; use one or the other"
            ));
        }
        let mut dims: Vec<(String, Range)> = Vec::new();
        for item in items {
            let (name, range) = item.split_once('=').unwrap_or((item, ""));
            let name = name.trim();
            if name.is_empty() || name.contains(char::is_whitespace) {
                return Err(format!("`{item}` needs a dimension name before `=`"));
            }
            if dims.iter().any(|(n, _)| n == name) {
                return Err(format!("the dimension `{name}` is named twice"));
            }
            dims.push((name.to_string(), Range::parse(range)?));
        }
        Ok(Selection::Dims(dims))
    }

    /// Whether `rank` of a mesh shaped `extent` is selected. A dimension
    /// the mesh does not have selects nothing.
    pub fn matches(&self, rank: u32, extent: &[(String, u32)]) -> bool {
        match self {
            Selection::Ranks(ranges) => ranges.iter().any(|r| r.contains(rank)),
            Selection::Dims(dims) => {
                let at = coords(extent, rank);
                dims.iter().all(|(name, range)| {
                    at.iter()
                        .find(|(n, _)| n == name)
                        .is_some_and(|(_, i)| range.contains(*i))
                })
            }
        }
    }
}

impl std::fmt::Display for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inside = match self {
            Selection::Ranks(ranges) => ranges
                .iter()
                .map(Range::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            Selection::Dims(dims) => dims
                .iter()
                .map(|(name, range)| format!("{name}={range}"))
                .collect::<Vec<_>>()
                .join(", "),
        };
        write!(f, "ranks({inside})")
    }
}

/// The coordinates of `rank` in `extent` (row-major, the last dimension
/// fastest).
pub fn coords(extent: &[(String, u32)], rank: u32) -> Vec<(String, u32)> {
    let mut left = rank;
    let mut at = vec![(String::new(), 0); extent.len()];
    for (i, (name, size)) in extent.iter().enumerate().rev() {
        let size = (*size).max(1);
        at[i] = (name.clone(), left % size);
        left /= size;
    }
    at
}

/// A line at the `monarch_dbg>` prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Nothing typed.
    Empty,
    /// `list`.
    List,
    /// `attach MESH RANK`.
    Attach {
        /// The actor mesh.
        mesh: String,
        /// The rank.
        rank: u32,
    },
    /// `detach`.
    Detach,
    /// `cast MESH ranks(SEL) CMD`.
    Cast {
        /// The actor mesh.
        mesh: String,
        /// The ranks.
        selection: Selection,
        /// The line each gets.
        line: String,
    },
    /// `interrupt MESH [ranks(SEL)]`: the selected ranks running on the
    /// debug engine (`run --debug`) stop at their next epoch tick.
    Interrupt {
        /// The actor mesh.
        mesh: String,
        /// The ranks (all when left out).
        selection: Selection,
    },
    /// `continue` (or `c`).
    Continue,
    /// `quit` (or `q`, `exit`).
    Quit,
    /// `help` (or `h`, `?`).
    Help,
}

impl Command {
    /// Parses one line typed at the prompt.
    pub fn parse(line: &str) -> Result<Command, String> {
        let line = line.trim();
        let (word, rest) = line
            .split_once(char::is_whitespace)
            .map_or((line, ""), |(w, r)| (w, r.trim()));
        let none = |command: Command| match rest.is_empty() {
            true => Ok(command),
            false => Err(format!("`{word}` takes nothing after it")),
        };
        match word {
            "" => Ok(Command::Empty),
            "list" | "ls" => none(Command::List),
            "detach" => none(Command::Detach),
            "continue" | "c" => none(Command::Continue),
            "quit" | "q" | "exit" => none(Command::Quit),
            "help" | "h" | "?" => none(Command::Help),
            "attach" => {
                let parts: Vec<&str> = rest.split_whitespace().collect();
                let [mesh, rank] = parts.as_slice() else {
                    return Err("usage: attach MESH RANK (e.g. attach trainers-v2 3)".into());
                };
                let rank = rank
                    .parse()
                    .map_err(|_| format!("`{rank}` is not a rank (a whole number)"))?;
                Ok(Command::Attach {
                    mesh: mesh.to_string(),
                    rank,
                })
            }
            "cast" => {
                let usage = "usage: cast MESH ranks(SEL) CMD (e.g. cast trainers ranks(0,3) c)";
                let (mesh, rest) = rest.split_once(char::is_whitespace).ok_or(usage)?;
                let rest = rest.trim_start();
                let inside = rest.strip_prefix("ranks(").ok_or(usage)?;
                let close = inside.find(')').ok_or("`ranks(` is not closed with `)`")?;
                let selection = Selection::parse(&inside[..close])?;
                let line = inside[close + 1..].trim();
                if line.is_empty() {
                    return Err(format!("{usage}: no CMD to send"));
                }
                Ok(Command::Cast {
                    mesh: mesh.to_string(),
                    selection,
                    line: line.to_string(),
                })
            }
            "interrupt" => {
                let usage = "usage: interrupt MESH [ranks(SEL)] (e.g. interrupt trainers ranks(0))";
                let (mesh, rest) = rest
                    .split_once(char::is_whitespace)
                    .map_or((rest, ""), |(m, r)| (m, r.trim()));
                if mesh.is_empty() {
                    return Err(usage.into());
                }
                let selection = match rest {
                    "" => Selection::Ranks(vec![Range::All]),
                    rest => {
                        let inside = rest.strip_prefix("ranks(").ok_or(usage)?;
                        let inside = inside
                            .strip_suffix(')')
                            .ok_or("`ranks(` is not closed with `)`, or something follows it")?;
                        Selection::parse(inside)?
                    }
                };
                Ok(Command::Interrupt {
                    mesh: mesh.to_string(),
                    selection,
                })
            }
            other => Err(format!("unknown command `{other}`; try `help`")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent() -> Vec<(String, u32)> {
        vec![("hosts".into(), 2), ("gpus".into(), 4)]
    }

    fn picked(selection: &str) -> Vec<u32> {
        let selection = Selection::parse(selection).unwrap();
        (0..8)
            .filter(|&r| selection.matches(r, &extent()))
            .collect()
    }

    #[test]
    fn flat_ranks_lists_and_ranges() {
        assert_eq!(picked("1,3"), [1, 3]);
        assert_eq!(picked("0:4"), [0, 1, 2, 3]);
        assert_eq!(picked("0:8:3"), [0, 3, 6]);
        assert_eq!(picked("6:"), [6, 7]);
        assert_eq!(picked("*"), (0..8).collect::<Vec<_>>());
        assert_eq!(picked(" 2 , 5:7 "), [2, 5, 6]);
    }

    #[test]
    fn dimensions_by_name() {
        assert_eq!(picked("hosts=1, gpus=0:2"), [4, 5]);
        assert_eq!(picked("hosts=0"), [0, 1, 2, 3]);
        assert_eq!(picked("gpus=3"), [3, 7]);
        assert_eq!(picked("hosts=*, gpus=1:4:2"), [1, 3, 5, 7]);
        assert!(picked("racks=0").is_empty(), "a dimension the mesh lacks");
    }

    #[test]
    fn bad_selections_say_why() {
        for (bad, says) in [
            ("", "selects nothing"),
            ("x", "not a rank"),
            ("3:1", "empty"),
            ("0:4:0", "step of 0"),
            ("hosts=1, 2", "mixes"),
            ("=1", "dimension name"),
            ("hosts=1, hosts=0", "twice"),
            ("1:2:3:4", "not N, A:B"),
        ] {
            let err = Selection::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn commands_with_dashed_mesh_names() {
        assert_eq!(
            Command::parse("cast trainers-v2.a ranks(0,3) p x + 1").unwrap(),
            Command::Cast {
                mesh: "trainers-v2.a".into(),
                selection: Selection::parse("0,3").unwrap(),
                line: "p x + 1".into(),
            }
        );
        assert_eq!(
            Command::parse("attach my-mesh 2").unwrap(),
            Command::Attach {
                mesh: "my-mesh".into(),
                rank: 2
            }
        );
        assert_eq!(
            Command::parse("cast w  ranks(hosts=1, gpus=0:2)   c").unwrap(),
            Command::Cast {
                mesh: "w".into(),
                selection: Selection::Dims(vec![
                    ("hosts".into(), Range::parse("1").unwrap()),
                    ("gpus".into(), Range::parse("0:2").unwrap()),
                ]),
                line: "c".into(),
            }
        );
        assert_eq!(Command::parse("  list ").unwrap(), Command::List);
        assert_eq!(Command::parse("c").unwrap(), Command::Continue);
        assert_eq!(Command::parse("").unwrap(), Command::Empty);
    }

    #[test]
    fn bad_commands_say_why() {
        for (bad, says) in [
            ("attach w", "usage: attach"),
            ("attach w x", "not a rank"),
            ("cast w 0,3 c", "usage: cast"),
            ("cast w ranks(0,3 c", "not closed"),
            ("cast w ranks(0,3)", "no CMD"),
            ("list now", "takes nothing"),
            ("frobnicate", "unknown command"),
        ] {
            let err = Command::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn interrupt_takes_a_mesh_and_an_optional_selection() {
        assert_eq!(
            Command::parse("interrupt stepper ranks(0)").unwrap(),
            Command::Interrupt {
                mesh: "stepper".into(),
                selection: Selection::parse("0").unwrap(),
            }
        );
        assert_eq!(
            Command::parse("interrupt w-2  ranks(hosts=1, gpus=0:2)").unwrap(),
            Command::Interrupt {
                mesh: "w-2".into(),
                selection: Selection::parse("hosts=1, gpus=0:2").unwrap(),
            }
        );
        assert_eq!(
            Command::parse("interrupt stepper").unwrap(),
            Command::Interrupt {
                mesh: "stepper".into(),
                selection: Selection::Ranks(vec![Range::All]),
            }
        );
        for (bad, says) in [
            ("interrupt", "usage: interrupt"),
            ("interrupt w 0", "usage: interrupt"),
            ("interrupt w ranks(0", "not closed"),
            ("interrupt w ranks(0) c", "not closed"),
            ("interrupt w ranks(x)", "not a rank"),
        ] {
            let err = Command::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }

    #[test]
    fn selections_print_as_typed() {
        for text in [
            "ranks(1, 3)",
            "ranks(0:4)",
            "ranks(hosts=1, gpus=0:2:2)",
            "ranks(*)",
        ] {
            let inside = &text["ranks(".len()..text.len() - 1];
            assert_eq!(Selection::parse(inside).unwrap().to_string(), text);
        }
    }

    #[test]
    fn coordinates_are_row_major() {
        assert_eq!(
            coords(&extent(), 6),
            vec![("hosts".to_string(), 1), ("gpus".to_string(), 2)]
        );
    }
}
