//! Actor mesh references as they travel: the JSON that
//! `actor-mesh.to-ref` writes and `actor-mesh.from-ref` reads
//! (`wit/README.md`, "Actor mesh references").
//!
//! A reference comes back from a guest, which may have written any bytes,
//! so [`parse`] checks every field before the host holds a mesh for it.
//! This file depends on serde, serde_json and hyperactor alone: the fuzz
//! target `reference` (`fuzz/`, docs/fuzzing.md) builds it from its source,
//! without the rest of monarch-host.
//!
//! - MR-1: a reference [`parse`] accepts holds exactly as many ranks as
//!   the product of its extent's sizes (multiplied with overflow checks,
//!   EX-1 of `mesh`), names no dimension twice, names each as an extent
//!   may (not empty, no `,`, `=` or space) with a size above 0, has
//!   `per_proc > 0`, and every rank lies below `procs.len() * per_proc`.
//! - MR-2: what [`encode`] writes, [`parse`] reads back as the same
//!   reference.

use hyperactor::ProcId;

/// An actor mesh reference, read and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshRef {
    /// The actor mesh's name as spawned; actor `r` is `name[r]`.
    pub name: String,
    /// The procs of the mesh as spawned, in order.
    pub procs: Vec<ProcId>,
    /// Actors per proc: rank `r` lives on `procs[r / per_proc]`.
    pub per_proc: u32,
    /// The shape of this view, as `(name, size)` pairs, outermost first.
    pub extent: Vec<(String, u32)>,
    /// The ranks of the mesh as spawned that this view holds, in row-major
    /// order.
    pub ranks: Vec<u32>,
}

/// The number of points of an extent, if it fits a rank (`u32`); None
/// when the product overflows (a guest may name any sizes: EX-1).
pub fn checked_extent_size(extent: &[(String, u32)]) -> Option<u32> {
    extent
        .iter()
        .try_fold(1u32, |size, (_, n)| size.checked_mul(*n))
}

/// Reads a reference, checking it (MR-1). The error says what is wrong,
/// in words a guest's author can act on.
pub fn parse(bytes: &[u8]) -> Result<MeshRef, String> {
    #[derive(serde::Deserialize)]
    struct Wire {
        monarch: Option<String>,
        version: Option<u32>,
        name: String,
        procs: Vec<String>,
        per_proc: u32,
        extent: Vec<(String, u32)>,
        ranks: Vec<u32>,
    }
    let wire: Wire =
        serde_json::from_slice(bytes).map_err(|e| format!("not an actor mesh reference: {e}"))?;
    if wire.monarch.as_deref().is_some_and(|m| m != "actor-mesh") || wire.version.unwrap_or(1) != 1
    {
        return Err("not an actor mesh reference of version 1 (see wit/README.md)".into());
    }
    hyperactor::id::validate_name(&wire.name).map_err(|e| format!("actor mesh reference: {e}"))?;
    let extent = wire.extent;
    // The rules of `Extent::new` (host/mesh/src/shape.rs), so that a view
    // made from a reference slices like any other.
    if let Some((name, size)) = extent.iter().find(|(name, size)| {
        *size == 0
            || name.is_empty()
            || name
                .chars()
                .any(|c| c == ',' || c == '=' || c.is_whitespace())
    }) {
        return Err(match size {
            0 => format!("actor mesh reference: the dimension `{name}` has size 0"),
            _ => format!(
                "actor mesh reference: `{name}` is not a dimension name (empty, or with `,`, `=` or a space)"
            ),
        });
    }
    if let Some((twice, _)) = extent
        .iter()
        .enumerate()
        .map(|(i, (name, _))| (name, i))
        .find(|(name, i)| extent[..*i].iter().any(|(other, _)| other == *name))
    {
        return Err(format!(
            "actor mesh reference: the dimension `{twice}` is named twice"
        ));
    }
    if checked_extent_size(&extent).map(|n| n as usize) != Some(wire.ranks.len())
        || wire.per_proc == 0
    {
        return Err("actor mesh reference: extent and ranks disagree".into());
    }
    let procs = wire
        .procs
        .iter()
        .map(|p| {
            p.parse::<ProcId>()
                .map_err(|e| format!("actor mesh reference: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let limit = procs.len() as u64 * wire.per_proc as u64;
    if wire.ranks.iter().any(|&r| r as u64 >= limit) {
        return Err("actor mesh reference: a rank is outside the mesh".into());
    }
    Ok(MeshRef {
        name: wire.name,
        procs,
        per_proc: wire.per_proc,
        extent,
        ranks: wire.ranks,
    })
}

/// Writes a reference as `wit/README.md` documents it (MR-2).
pub fn encode(reference: &MeshRef) -> Vec<u8> {
    let value = serde_json::json!({
        "monarch": "actor-mesh",
        "version": 1,
        "name": reference.name,
        "procs": reference.procs.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        "per_proc": reference.per_proc,
        "extent": reference.extent,
        "ranks": reference.ranks,
    });
    value.to_string().into_bytes()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A reference as JSON with these fields.
    pub(crate) fn forged(extent: &str, ranks: &str) -> Vec<u8> {
        format!(
            r#"{{"name":"m","procs":["local:x,p"],"per_proc":1,"extent":{extent},"ranks":{ranks}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn mr_1_every_check_says_what_is_wrong() {
        let error = |bytes: &[u8]| parse(bytes).unwrap_err();
        assert!(error(b"\xff").starts_with("not an actor mesh reference: "));
        let other = br#"{"monarch":"buffer","version":1,"name":"m","procs":[],"per_proc":1,"extent":[],"ranks":[0]}"#;
        assert!(error(other).contains("of version 1"));
        let bad_name =
            br#"{"name":"a b","procs":["local:x,p"],"per_proc":1,"extent":[],"ranks":[0]}"#;
        assert!(error(bad_name).starts_with("actor mesh reference: "));
        assert!(error(&forged(r#"[["x",1],["x",1]]"#, "[0]")).contains("`x` is named twice"));
        assert!(error(&forged(r#"[["x",0]]"#, "[]")).contains("`x` has size 0"));
        assert!(error(&forged(r#"[["a b",1]]"#, "[0]")).contains("not a dimension name"));
        assert!(error(&forged(r#"[["",1]]"#, "[0]")).contains("not a dimension name"));
        assert!(error(&forged(r#"[["x",2]]"#, "[0]")).contains("extent and ranks disagree"));
        assert!(error(&forged(r#"[["x",2]]"#, "[0,1]")).contains("a rank is outside the mesh"));
        let zero = br#"{"name":"m","procs":["local:x,p"],"per_proc":0,"extent":[],"ranks":[0]}"#;
        assert!(error(zero).contains("extent and ranks disagree"));
        let bad_proc = br#"{"name":"m","procs":["no comma"],"per_proc":1,"extent":[],"ranks":[0]}"#;
        assert!(error(bad_proc).starts_with("actor mesh reference: "));
        let big = u32::MAX;
        let overflow = forged(&format!(r#"[["a",{big}],["b",{big}]]"#), "[]");
        assert!(error(&overflow).contains("extent and ranks disagree"));
    }

    #[test]
    fn mr_2_an_encoded_reference_reads_back_the_same() {
        let reference = MeshRef {
            name: "greeter".into(),
            procs: vec!["local:x,p".parse().unwrap(), "local:y,q".parse().unwrap()],
            per_proc: 2,
            extent: vec![("hosts".into(), 2), ("gpus".into(), 1)],
            ranks: vec![1, 3],
        };
        let bytes = encode(&reference);
        assert_eq!(parse(&bytes), Ok(reference));
        // The documented fields (wit/README.md), with its marker and version.
        let text = String::from_utf8(bytes).unwrap();
        for field in [
            r#""monarch":"actor-mesh""#,
            r#""version":1"#,
            r#""procs":["local:x,p","local:y,q"]"#,
            r#""extent":[["hosts",2],["gpus",1]]"#,
        ] {
            assert!(text.contains(field), "{field} in {text}");
        }
    }
}
