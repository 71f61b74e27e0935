//! The ground floor: the Pod API's facts, each written once, for every room above to read. What a pod spec holds
//! ([`spec`]: its container lists, a volume's sources, the unions of env vars, probes and hooks), how its lists
//! and objects merge ([`merge_rules`], and the one walk that applies them, [`add_only`]), how its JSON reads where
//! a field is missing or ill-typed ([`read`]), how it decodes into the API types ([`decode`]) and which of those
//! types' fields each release keeps ([`releases`]) and which an admission plugin owns ([`plugins`]).
//!
//! Read by the merge and `/validate`, template compiling and combining, validation, Pod Security and `offline`.
//! It imports nothing from the rest of the crate, so that nothing here can climb back up into a room that reads
//! it.

pub(crate) mod add_only;
pub(crate) mod decode;
pub(crate) mod merge_rules;
pub(crate) mod plugins;
pub(crate) mod read;
pub(crate) mod releases;
pub(crate) mod spec;
