//! Identities of procs, actors and ports, and their text forms.
//!
//! Every identity has one stable text form that [`Display`](fmt::Display)
//! writes and [`FromStr`] reads back:
//!
//! | identity | form | example |
//! | --- | --- | --- |
//! | [`ProcId`] | `ADDR,PROC` | `tcp:127.0.0.1:4000,worker` |
//! | [`ActorId`] | `ADDR,PROC,ACTOR[RANK]` | `unix:/tmp/w.sock,worker,echo[3]` |
//! | [`PortId`] | `ADDR,PROC,ACTOR[RANK][PORT]` | `local:a,a,client[0][7]` |
//!
//! Names are made of ASCII letters, digits, `-`, `_` and `.`, so the text is
//! parsed from the right and an address may hold any character.
//!
//! Identities are cheap to clone (one reference count) because every message
//! carries two of them.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::channel::ChannelAddr;

/// Why a text could not be read as an identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdParseError {
    /// The text has fewer `,`-separated parts than the identity needs.
    #[error("`{0}` is not an identity: expected ADDR,PROC[,ACTOR[RANK]]")]
    MissingPart(String),
    /// A name holds a character outside `[A-Za-z0-9_.-]` or is empty.
    #[error("invalid name `{0}`: use ASCII letters, digits, `-`, `_` and `.`")]
    InvalidName(String),
    /// The `[RANK]` or `[PORT]` suffix is missing or not a number.
    #[error("invalid index in `{0}`: expected NAME[NUMBER]")]
    InvalidIndex(String),
    /// The address part is not a channel address.
    #[error(transparent)]
    Addr(#[from] crate::channel::AddrParseError),
}

/// Checks that `name` can appear in an identity.
pub fn validate_name(name: &str) -> Result<(), IdParseError> {
    let ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(IdParseError::InvalidName(name.to_string()))
    }
}

/// The fields of the ids, public only inside this private module so that
/// their archived forms can be the ids' own.
mod repr {
    use super::ProcId;
    use crate::channel::ChannelAddr;

    #[derive(
        Debug,
        Clone,
        PartialEq,
        Eq,
        Hash,
        PartialOrd,
        Ord,
        rkyv::Archive,
        rkyv::Serialize,
        rkyv::Deserialize,
    )]
    pub struct ProcIdInner {
        pub addr: ChannelAddr,
        pub name: String,
    }

    #[derive(
        Debug,
        Clone,
        PartialEq,
        Eq,
        Hash,
        PartialOrd,
        Ord,
        rkyv::Archive,
        rkyv::Serialize,
        rkyv::Deserialize,
    )]
    pub struct ActorIdInner {
        pub proc: ProcId,
        pub name: String,
        pub rank: u32,
    }
}

use repr::{
    ActorIdInner, ActorIdInnerResolver, ArchivedActorIdInner, ArchivedProcIdInner, ProcIdInner,
    ProcIdInnerResolver,
};

/// The identity of a proc: the address it serves on and its name.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcId(Arc<ProcIdInner>);

// Ids are archived inline, not as shared pointers: validating and decoding
// shared pointers keeps a table of them for every message, which costs
// more than the few bytes sharing would save.
impl rkyv::Archive for ProcId {
    type Archived = ArchivedProcId;
    type Resolver = ProcIdInnerResolver;

    fn resolve(&self, resolver: Self::Resolver, out: rkyv::Place<Self::Archived>) {
        <ProcIdInner as rkyv::Archive>::resolve(&self.0, resolver, out);
    }
}

impl<S: rkyv::rancor::Fallible + ?Sized> rkyv::Serialize<S> for ProcId
where
    ProcIdInner: rkyv::Serialize<S>,
{
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        <ProcIdInner as rkyv::Serialize<S>>::serialize(&self.0, serializer)
    }
}

/// Ids decoded lately on this thread. A stream of messages carries the
/// same few ids (a caller's reply port, the proc a cast is for, the comm
/// actors a caster hears back from) again and again; handing out the one
/// already decoded saves its allocations. Two ways of `SETS` sets, by a
/// hash of the archived id: a caster that hears from 16 or 64 procs finds
/// every one of them (eight slots in turn held none of 16 senders).
struct Recent<T> {
    ids: [Option<T>; 2 * SETS],
    /// Which way of each set was used last; the other is replaced.
    last: [u8; SETS],
}

const SETS: usize = 128;

impl<T: Clone> Recent<T> {
    const fn new() -> Self {
        Recent {
            ids: [const { None }; 2 * SETS],
            last: [0; SETS],
        }
    }

    fn find(&mut self, key: u64, matches: impl Fn(&T) -> bool) -> Option<T> {
        let set = key as usize % SETS;
        for way in 0..2 {
            if let Some(id) = &self.ids[2 * set + way]
                && matches(id)
            {
                self.last[set] = way as u8;
                return Some(id.clone());
            }
        }
        None
    }

    fn remember(&mut self, key: u64, id: &T) {
        let set = key as usize % SETS;
        let way = 1 - self.last[set] as usize;
        self.ids[2 * set + way] = Some(id.clone());
        self.last[set] = way as u8;
    }
}

/// The key of an archived proc id in [`Recent`].
fn proc_key(archived: &ArchivedProcId) -> u64 {
    use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
    let mut h = foldhash::fast::FixedState::with_seed(0x6d6f6e61).build_hasher();
    archived.name.as_str().hash(&mut h);
    archived.addr.key(&mut h);
    h.finish()
}

/// The key of an archived actor id in [`Recent`].
fn actor_key(archived: &ArchivedActorId) -> u64 {
    use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
    let mut h = foldhash::fast::FixedState::with_seed(0x72636879).build_hasher();
    archived.name.as_str().hash(&mut h);
    archived.rank.to_native().hash(&mut h);
    proc_key(&archived.proc).hash(&mut h);
    h.finish()
}

thread_local! {
    static RECENT_PROC_IDS: std::cell::RefCell<Recent<ProcId>> =
        const { std::cell::RefCell::new(Recent::new()) };
    static RECENT_ACTOR_IDS: std::cell::RefCell<Recent<ActorId>> =
        const { std::cell::RefCell::new(Recent::new()) };
}

impl<D: rkyv::rancor::Fallible + ?Sized> rkyv::Deserialize<ProcId, D> for ArchivedProcId
where
    ArchivedProcId: rkyv::Deserialize<ProcIdInner, D>,
{
    fn deserialize(&self, deserializer: &mut D) -> Result<ProcId, D::Error> {
        let key = proc_key(self);
        let known = RECENT_PROC_IDS
            .with_borrow_mut(|recent| recent.find(key, |id| id.matches_archived(self)));
        if let Some(id) = known {
            return Ok(id);
        }
        let inner =
            <ArchivedProcId as rkyv::Deserialize<ProcIdInner, D>>::deserialize(self, deserializer)?;
        let id = ProcId(Arc::new(inner));
        RECENT_PROC_IDS.with_borrow_mut(|recent| recent.remember(key, &id));
        Ok(id)
    }
}

/// The archived form of a [`ProcId`].
pub(crate) type ArchivedProcId = ArchivedProcIdInner;

impl ProcId {
    /// A proc id from an address and a name. Fails on an invalid name.
    pub fn new(addr: ChannelAddr, name: &str) -> Result<Self, IdParseError> {
        validate_name(name)?;
        Ok(ProcId(Arc::new(ProcIdInner {
            addr,
            name: name.to_string(),
        })))
    }

    /// The address the proc serves on.
    pub fn addr(&self) -> &ChannelAddr {
        &self.0.addr
    }

    /// The proc's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The id of the actor `name[rank]` in this proc.
    pub fn actor_id(&self, name: &str, rank: u32) -> Result<ActorId, IdParseError> {
        validate_name(name)?;
        Ok(ActorId(Arc::new(ActorIdInner {
            proc: self.clone(),
            name: name.to_string(),
            rank,
        })))
    }

    pub(crate) fn same(&self, other: &ProcId) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }

    /// Whether an archived proc id names this proc, without decoding it.
    pub(crate) fn matches_archived(&self, archived: &ArchivedProcId) -> bool {
        archived.name == self.0.name.as_str() && self.0.addr.matches_archived(&archived.addr)
    }
}

impl fmt::Display for ProcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.0.addr, self.0.name)
    }
}

impl fmt::Debug for ProcId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProcId({self})")
    }
}

impl FromStr for ProcId {
    type Err = IdParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, name) = s
            .rsplit_once(',')
            .ok_or_else(|| IdParseError::MissingPart(s.to_string()))?;
        ProcId::new(addr.parse()?, name)
    }
}

/// The identity of an actor: its proc, its name and its rank.
///
/// Actors of one mesh share a name and differ by rank; a lone actor has rank 0.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorId(Arc<ActorIdInner>);

impl rkyv::Archive for ActorId {
    type Archived = ArchivedActorId;
    type Resolver = ActorIdInnerResolver;

    fn resolve(&self, resolver: Self::Resolver, out: rkyv::Place<Self::Archived>) {
        <ActorIdInner as rkyv::Archive>::resolve(&self.0, resolver, out);
    }
}

impl<S: rkyv::rancor::Fallible + ?Sized> rkyv::Serialize<S> for ActorId
where
    ActorIdInner: rkyv::Serialize<S>,
{
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        <ActorIdInner as rkyv::Serialize<S>>::serialize(&self.0, serializer)
    }
}

/// The archived form of an [`ActorId`].
pub(crate) type ArchivedActorId = ArchivedActorIdInner;

impl<D> rkyv::Deserialize<ActorId, D> for ArchivedActorId
where
    D: rkyv::rancor::Fallible + ?Sized,
    ArchivedActorId: rkyv::Deserialize<ActorIdInner, D>,
{
    fn deserialize(&self, deserializer: &mut D) -> Result<ActorId, D::Error> {
        let key = actor_key(self);
        let known = RECENT_ACTOR_IDS
            .with_borrow_mut(|recent| recent.find(key, |id| id.matches_archived(self)));
        if let Some(id) = known {
            return Ok(id);
        }
        let inner = <ArchivedActorId as rkyv::Deserialize<ActorIdInner, D>>::deserialize(
            self,
            deserializer,
        )?;
        let id = ActorId(Arc::new(inner));
        RECENT_ACTOR_IDS.with_borrow_mut(|recent| recent.remember(key, &id));
        Ok(id)
    }
}

impl ActorId {
    /// The actor's proc.
    pub fn proc_id(&self) -> &ProcId {
        &self.0.proc
    }

    /// The actor's name.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The actor's rank.
    pub fn rank(&self) -> u32 {
        self.0.rank
    }

    /// The id of port `port` of this actor.
    pub fn port_id(&self, port: u64) -> PortId {
        PortId {
            actor: self.clone(),
            port,
        }
    }

    /// Whether an archived actor id names this actor, without decoding it.
    pub(crate) fn matches_archived(&self, archived: &ArchivedActorId) -> bool {
        archived.rank.to_native() == self.0.rank
            && archived.name == self.0.name.as_str()
            && self.0.proc.matches_archived(&archived.proc)
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}[{}]", self.0.proc, self.0.name, self.0.rank)
    }
}

impl fmt::Debug for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ActorId({self})")
    }
}

/// Splits `name[index]` into its parts.
fn split_indexed(s: &str) -> Result<(&str, u64), IdParseError> {
    let bad = || IdParseError::InvalidIndex(s.to_string());
    let body = s.strip_suffix(']').ok_or_else(bad)?;
    let (name, index) = body.rsplit_once('[').ok_or_else(bad)?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    Ok((name, index.parse().map_err(|_| bad())?))
}

impl FromStr for ActorId {
    type Err = IdParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (proc, actor) = s
            .rsplit_once(',')
            .ok_or_else(|| IdParseError::MissingPart(s.to_string()))?;
        let (name, rank) = split_indexed(actor)?;
        let rank = u32::try_from(rank).map_err(|_| IdParseError::InvalidIndex(s.to_string()))?;
        proc.parse::<ProcId>()?.actor_id(name, rank)
    }
}

/// The identity of a port: an actor and a port number in its mailbox.
#[derive(
    Clone, PartialEq, Eq, Hash, PartialOrd, Ord, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct PortId {
    actor: ActorId,
    port: u64,
}

impl PortId {
    /// The actor that owns the port.
    pub fn actor_id(&self) -> &ActorId {
        &self.actor
    }

    /// The port number within the actor's mailbox.
    pub fn index(&self) -> u64 {
        self.port
    }
}

impl ArchivedPortId {
    /// The archived actor and the port number.
    pub(crate) fn parts(&self) -> (&ArchivedActorId, u64) {
        (&self.actor, self.port.to_native())
    }
}

impl fmt::Display for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}]", self.actor, self.port)
    }
}

impl fmt::Debug for PortId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PortId({self})")
    }
}

impl FromStr for PortId {
    type Err = IdParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (actor, port) = split_indexed(s)?;
        Ok(actor.parse::<ActorId>()?.port_id(port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_forms_round_trip() {
        for text in [
            "tcp:127.0.0.1:4000,worker",
            "unix:/tmp/a,b/w.sock,worker",
            "local:one,one",
            "tcp:[::1]:9,p-1.x_y",
        ] {
            let id: ProcId = text.parse().unwrap();
            assert_eq!(id.to_string(), text);
            let actor = id.actor_id("echo", 3).unwrap();
            let actor_text = format!("{text},echo[3]");
            assert_eq!(actor.to_string(), actor_text);
            assert_eq!(actor_text.parse::<ActorId>().unwrap(), actor);
            let port = actor.port_id(77);
            assert_eq!(port.to_string(), format!("{actor_text}[77]"));
            assert_eq!(port.to_string().parse::<PortId>().unwrap(), port);
        }
    }

    #[test]
    fn parts_are_read_back() {
        let actor: ActorId = "unix:/run/x.sock,trainer,worker[12]".parse().unwrap();
        assert_eq!(actor.name(), "worker");
        assert_eq!(actor.rank(), 12);
        assert_eq!(actor.proc_id().name(), "trainer");
        assert_eq!(actor.proc_id().addr().to_string(), "unix:/run/x.sock");
    }

    #[test]
    fn bad_text_is_rejected_with_a_reason() {
        assert!(matches!(
            "worker".parse::<ProcId>(),
            Err(IdParseError::MissingPart(_))
        ));
        assert!(matches!(
            "tcp:127.0.0.1:1,p,echo".parse::<ActorId>(),
            Err(IdParseError::InvalidIndex(_))
        ));
        assert!(matches!(
            "tcp:127.0.0.1:1,p,echo[-1]".parse::<ActorId>(),
            Err(IdParseError::InvalidIndex(_))
        ));
        assert!(matches!(
            "tcp:127.0.0.1:1,p,echo[99999999999]".parse::<ActorId>(),
            Err(IdParseError::InvalidIndex(_))
        ));
        assert!(matches!(
            "tcp:127.0.0.1:1,p q".parse::<ProcId>(),
            Err(IdParseError::InvalidName(_))
        ));
        assert!(matches!(
            "carrier-pigeon:x,p".parse::<ProcId>(),
            Err(IdParseError::Addr(_))
        ));
        assert!(ProcId::new("local:x".parse().unwrap(), "").is_err());
    }

    /// Decoding an id seen lately hands out the same id, not a copy; a
    /// different id that differs in one part is never mistaken for it.
    #[test]
    fn recent_ids_decode_to_the_same_id_and_others_to_their_own() {
        let decode_proc = |id: &ProcId| {
            let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(id).unwrap();
            rkyv::from_bytes::<ProcId, rkyv::rancor::Error>(&bytes).unwrap()
        };
        let decode_actor = |id: &ActorId| {
            let bytes = rkyv::to_bytes::<rkyv::rancor::Error>(id).unwrap();
            rkyv::from_bytes::<ActorId, rkyv::rancor::Error>(&bytes).unwrap()
        };
        let proc: ProcId = "unix:/tmp/recent-ids.sock,worker".parse().unwrap();
        let (first, second) = (decode_proc(&proc), decode_proc(&proc));
        assert_eq!(first, proc);
        assert!(Arc::ptr_eq(&first.0, &second.0));
        for other in [
            "unix:/tmp/recent-ids.sock,worker2",
            "unix:/tmp/recent-ids2.sock,worker",
            "tcp:127.0.0.1:1,worker",
        ] {
            let other: ProcId = other.parse().unwrap();
            assert_eq!(decode_proc(&other), other);
        }
        let actor = proc.actor_id("greeter", 3).unwrap();
        let (first, second) = (decode_actor(&actor), decode_actor(&actor));
        assert_eq!(first, actor);
        assert!(Arc::ptr_eq(&first.0, &second.0));
        let next = proc.actor_id("greeter", 4).unwrap();
        assert_eq!(decode_actor(&next), next);
    }

    /// A caster hears from many procs in turn: the comm actor of each of
    /// 64 procs, decoded round after round, is decoded once (eight slots
    /// used in turn kept none of 16).
    #[test]
    fn ids_of_64_senders_in_turn_are_each_decoded_once() {
        let senders: Vec<ActorId> = (0..64)
            .map(|i| {
                let proc: ProcId = format!("unix:/tmp/senders/proc-{i}.sock,proc-{i}")
                    .parse()
                    .unwrap();
                proc.actor_id("comm", 0).unwrap()
            })
            .collect();
        let archived: Vec<_> = senders
            .iter()
            .map(|id| rkyv::to_bytes::<rkyv::rancor::Error>(id).unwrap())
            .collect();
        let decode =
            |bytes: &[u8]| rkyv::from_bytes::<ActorId, rkyv::rancor::Error>(bytes).unwrap();
        let first: Vec<ActorId> = archived.iter().map(|b| decode(b)).collect();
        for round in 0..3 {
            for (i, bytes) in archived.iter().enumerate() {
                let again = decode(bytes);
                assert_eq!(again, senders[i]);
                assert!(
                    Arc::ptr_eq(&again.0, &first[i].0),
                    "round {round}: sender {i} was decoded anew"
                );
            }
        }
    }
}
