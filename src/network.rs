//! The sandbox's network: a policy for each connection a sandboxed command
//! asks the host's proxy for, and the proxy's parsers.
//!
//! The pieces, each pure and tested on its own: [`addr`] (the one
//! canonical form of a host, and which addresses are public), [`policy`]
//! (the trusted configuration's grammar of allowed, denied and private
//! destinations, and matching), [`decide`] (a connection's decision:
//! built-in refusals, deny, allow or grant, review before any lookup, one
//! lookup whose every address is checked), and [`wire`] (the first bytes of
//! a connection: HTTP `CONNECT`, absolute-form plain HTTP, SOCKS5, the TLS
//! ClientHello's server name), each bounded in size; [`proxy`] serves one
//! sandbox's listener, [`tunnel`] relays its tunnels' bytes, and
//! [`review`] keeps the review's grants and open dialogs.
//!
//! Not here: reading the configuration file (`config`), the listener in
//! the sandbox's network namespace (`nshelper`), and the review's dialog
//! (the extension's JavaScript). See `docs/network.md`.

pub mod addr;
pub mod decide;
pub mod policy;
pub mod proxy;
pub mod review;
pub mod tunnel;
pub mod wire;
