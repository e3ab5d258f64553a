//! An in-memory kernel for unit tests without root: links per namespace, a
//! record of every call, and failures injected by operation and call number.
//!
//! It behaves as the kernel does where the callers depend on it: a move
//! asks for an ifindex and gets `EBUSY` when it is taken (or, as kernels
//! before 5.13 do with [`FakeKernel::ignore_new_ifindex`], keeps the index
//! when free and takes a new one otherwise); a move closes the link and
//! flushes its addresses; a name taken in the target is `EEXIST` (with
//! [`FakeKernel::move_then_rename`] the link first moves under its old name,
//! as older kernels did); a MAC another macvtap on the same lower uses is
//! `EADDRINUSE`; a missing link is `ENODEV`; a namespace that goes away
//! destroys the virtual links in it (a macvtap, and with it its `/dev/tapN`)
//! and gives a physical NIC back to the host.
//!
//! It can also play a process that dies ([`FakeKernel::crash_after`]): the
//! chosen call takes effect and then the caller's run is abandoned by
//! unwinding with [`Crashed`], and every later call is refused until
//! [`FakeKernel::restart`] starts the next process.
//!
//! It keeps devtmpfs' `/dev/tapN` nodes as the kernel does: a macvtap's
//! node appears with it when no node of that name exists (two macvtaps in
//! different namespaces may share an ifindex; the node is the first one's),
//! goes with it, and is gone while the macvtap moves between namespaces
//! (`NETDEV_UNREGISTER`, then `NETDEV_REGISTER` in the new one). And it lets
//! another process act at a chosen point of a run ([`FakeKernel::before`],
//! [`FakeKernel::amid_move`]): in the middle of a move the link is in no
//! namespace and has no node, and the other process's first change (a
//! create, delete, set or move, which takes the RTNL lock the move holds)
//! waits for the move to finish, as the kernel makes it wait. The other
//! process's calls are not counted, failed or killed with the run's.

use macvtap_link::tapdev::TapNode;
use macvtap_link::{Error, Kernel, Link, LinkChange, Links, MacvtapMode, Netns, Op, Result};
use nix::errno::Errno;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The name the fake gives the calling thread's namespace, as [`Netns::current`] does.
pub const HOST: &str = macvtap_link::netns::CURRENT_NETNS;

/// A link as the kernel reports it: `index`, `name`, `kind` and lower
/// link, the rest default (for building link lists in unit tests).
pub fn link(index: u32, name: &str, kind: &str, lower: Option<u32>) -> Link {
    Link {
        index,
        name: name.into(),
        kind: Some(kind.into()),
        lower_index: lower,
        ..Default::default()
    }
}

/// A physical NIC as the kernel reports it (no kind): `index`, `name`,
/// and up (operational state `up`, `IFF_UP`) or down.
pub fn nic(index: u32, name: &str, up: bool) -> Link {
    Link {
        index,
        name: name.into(),
        oper_state: if up { "up" } else { "down" }.into(),
        flags: u32::from(up),
        ..Default::default()
    }
}

/// The major number the fake gives every tap device.
pub const TAP_MAJOR: u64 = 240;

/// One call the fake served, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// Which operation.
    pub op: Op,
    /// The namespace it acted in (or on).
    pub netns: PathBuf,
    /// The link name, path or key it was about.
    pub target: String,
    /// The errno it failed with, `None` when it succeeded.
    pub failed: Option<Errno>,
}

#[derive(Debug, Clone)]
struct FakeLink {
    /// Identity across moves (ifindex and name change).
    id: u64,
    link: Link,
    addrs: Vec<(IpAddr, u8)>,
    routes: Vec<(IpAddr, u8, Option<IpAddr>)>,
}

/// The payload a run unwinds with when the fake plays its death
/// ([`FakeKernel::crash_after`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crashed;

/// Where the process the fake plays dies, and whether it has.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// Every call is served.
    #[default]
    Alive,
    /// The `nth` call (from 1) of `op` is the last one to take effect.
    DiesAfter(Op, usize),
    /// The call being served is the last one; the run ends when it returns.
    Dying,
    /// Dead: every call is refused; counts calls that were still tried.
    Dead { tried: usize },
}

/// What another process does at a point of the run (see
/// [`FakeKernel::before`]).
type Act = Box<dyn FnOnce() + Send>;

/// Where another process acts: before the `nth` call of `op`, or amid the
/// `nth` move.
struct Hook {
    op: Op,
    nth: usize,
    amid: bool,
    act: Act,
}

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}{:?} {}",
            if self.amid { "amid " } else { "before " },
            self.op,
            self.nth
        )
    }
}

/// A move half done: the link out of every namespace, its node gone.
#[derive(Debug)]
struct Transit {
    link: FakeLink,
    to: PathBuf,
}

#[derive(Debug, Default)]
struct State {
    namespaces: BTreeMap<PathBuf, Vec<FakeLink>>,
    /// devtmpfs: `/dev/tap<ifindex>` and the id of the link whose char
    /// device it is.
    tap_nodes: BTreeMap<u32, u64>,
    hooks: Vec<Hook>,
    transit: Option<Transit>,
    /// Set while another process acts (a hook runs).
    other: usize,
    other_calls: Vec<Call>,
    next_id: u64,
    ignore_new_ifindex: bool,
    move_then_rename: bool,
    failures: Vec<(Op, usize, Errno)>,
    life: Life,
    counts: HashMap<Op, usize>,
    calls: Vec<Call>,
    sysctls: BTreeMap<(PathBuf, String), String>,
    chowned: BTreeMap<PathBuf, (u32, u32)>,
}

/// The fake kernel; see the module docs.
#[derive(Debug)]
pub struct FakeKernel {
    state: Mutex<State>,
}

impl Default for FakeKernel {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeKernel {
    /// A kernel with an empty host namespace ([`HOST`]).
    pub fn new() -> Self {
        let mut state = State {
            next_id: 1,
            ..Default::default()
        };
        state.namespaces.insert(PathBuf::from(HOST), Vec::new());
        Self {
            state: Mutex::new(state),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock has failed already.
        match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Adds an empty namespace at `path` (a pod's `CNI_NETNS`).
    pub fn add_netns(&self, path: &str) {
        self.state()
            .namespaces
            .insert(PathBuf::from(path), Vec::new());
    }

    /// Removes namespace `path`, as a pod's end does, and what the kernel
    /// does with its links: virtual links (a macvtap, a veth) are destroyed
    /// with it, and a macvtap's `/dev/tapN` with them; a physical NIC (no
    /// kind) goes back to the host namespace, under a `dev<N>` name if its
    /// own is taken there (`default_device_exit_net` in `net/core/dev.c`).
    pub fn remove_netns(&self, path: &str) {
        let mut st = self.state();
        let Some(links) = st.namespaces.remove(Path::new(path)) else {
            return;
        };
        for gone in links.iter().filter(|l| l.link.kind.is_some()) {
            st.drop_node(gone);
        }
        for mut nic in links.into_iter().filter(|l| l.link.kind.is_none()) {
            let host = Path::new(HOST);
            let taken = |st: &State, f: &dyn Fn(&Link) -> bool| {
                st.namespaces
                    .get(host)
                    .is_some_and(|ls| ls.iter().any(|l| f(&l.link)))
            };
            if taken(&st, &|l| l.index == nic.link.index) {
                nic.link.index = st.free_index(host, 2);
            }
            if taken(&st, &|l| l.name == nic.link.name) {
                nic.link.name = format!("dev{}", nic.link.index);
            }
            nic.link.flags &= !(nix::libc::IFF_UP as u32);
            nic.link.oper_state = "down".into();
            nic.addrs.clear();
            nic.routes.clear();
            st.namespaces
                .entry(host.to_path_buf())
                .or_default()
                .push(nic);
        }
    }

    /// Plays a process killed right after the `nth` call (from 1) of `op`:
    /// that call takes effect, then the run unwinds with [`Crashed`] (catch
    /// it with `std::panic::catch_unwind`), as nothing after it would run;
    /// every later call is refused with `ESRCH` and counted
    /// ([`FakeKernel::calls_after_death`]), since a dead process makes none.
    pub fn crash_after(&self, op: Op, nth: usize) {
        self.state().life = Life::DiesAfter(op, nth);
    }

    /// Whether the process the fake plays has died ([`FakeKernel::crash_after`]).
    pub fn crashed(&self) -> bool {
        matches!(self.state().life, Life::Dead { .. })
    }

    /// How many calls were tried after the process died: a destructor or
    /// anything else that touched the kernel after the crash point.
    pub fn calls_after_death(&self) -> usize {
        match self.state().life {
            Life::Dead { tried } => tried,
            _ => 0,
        }
    }

    /// Starts the next process (the runtime's next plugin run): calls are
    /// served again; the kernel's state and the call numbering go on.
    pub fn restart(&self) {
        self.state().life = Life::Alive;
    }

    /// Puts `link` into namespace `netns` as it is (index 0 takes the lowest
    /// free index from 2 up) and returns it.
    pub fn insert_link(&self, netns: &str, mut link: Link) -> Link {
        let mut st = self.state();
        if link.index == 0 {
            link.index = st.free_index(Path::new(netns), 2);
        }
        let id = st.next_id;
        st.next_id += 1;
        let new = FakeLink {
            id,
            link: link.clone(),
            addrs: Vec::new(),
            routes: Vec::new(),
        };
        st.make_node(&new);
        st.namespaces
            .entry(PathBuf::from(netns))
            .or_default()
            .push(new);
        link
    }

    /// The char device `/dev/tap<ifindex>` is now (the fake's major and
    /// the link's identity), `None` when there is no such node.
    pub fn tap_node(&self, ifindex: u32) -> Option<(u64, u64)> {
        self.state()
            .tap_nodes
            .get(&ifindex)
            .map(|id| (TAP_MAJOR, *id))
    }

    /// Lets another process run `act` right before the `nth` call (from 1)
    /// of `op` of the run: the call then finds what `act` left.
    pub fn before(&self, op: Op, nth: usize, act: impl FnOnce() + Send + 'static) {
        self.state().hooks.push(Hook {
            op,
            nth,
            amid: false,
            act: Box::new(act),
        });
    }

    /// Lets another process run `act` in the middle of the run's `nth` move
    /// (from 1): the link has left its namespace and its tap node is gone,
    /// and the move finishes before `act`'s first change, or after `act`.
    pub fn amid_move(&self, nth: usize, act: impl FnOnce() + Send + 'static) {
        self.state().hooks.push(Hook {
            op: Op::MoveLink,
            nth,
            amid: true,
            act: Box::new(act),
        });
    }

    /// Removes the hooks that never ran (their point never came) and says
    /// how many there were.
    pub fn drop_hooks(&self) -> usize {
        let mut st = self.state();
        let n = st.hooks.len();
        st.hooks.clear();
        n
    }

    /// The calls other processes made in hooks, in order.
    pub fn other_calls(&self) -> Vec<Call> {
        self.state().other_calls.clone()
    }

    /// Runs `act` as another process.
    fn act_as_other(&self, act: Act) {
        self.state().other += 1;
        // The other process's panic is the test's failure: let it through,
        // but not with the lock's count wrong.
        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(act));
        self.state().other -= 1;
        if let Err(payload) = done {
            std::panic::resume_unwind(payload);
        }
    }

    /// The hook for the `nth` call of `op` (`amid` or before), taken out.
    fn take_hook(&self, op: Op, nth: usize, amid: bool) -> Option<Act> {
        let mut st = self.state();
        let at = st
            .hooks
            .iter()
            .position(|h| h.op == op && h.nth == nth && h.amid == amid)?;
        Some(st.hooks.remove(at).act)
    }

    /// Adds a physical NIC `name` (MTU 1500, up) to `netns`.
    pub fn add_nic(&self, netns: &str, name: &str) -> Link {
        self.insert_link(
            netns,
            Link {
                name: name.to_string(),
                mtu: 1500,
                flags: nix::libc::IFF_UP as u32,
                oper_state: "up".into(),
                txqueuelen: 1000,
                ..Default::default()
            },
        )
    }

    /// Makes the next operations behave as kernels before 5.13, which ignore
    /// the ifindex a move asks for (`IFLA_NEW_IFINDEX`).
    pub fn ignore_new_ifindex(&self) {
        self.state().ignore_new_ifindex = true;
    }

    /// Makes a move whose new name is taken leave the link moved under its
    /// old name (older kernels moved, then renamed).
    pub fn move_then_rename(&self) {
        self.state().move_then_rename = true;
    }

    /// Makes the `nth` call (from 1) of `op` fail with `errno`, changing nothing.
    pub fn fail(&self, op: Op, nth: usize, errno: Errno) {
        self.state().failures.push((op, nth, errno));
    }

    /// How many times `op` was called.
    pub fn count(&self, op: Op) -> usize {
        self.state().counts.get(&op).copied().unwrap_or(0)
    }

    /// Every call served so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// The links of `netns`, in creation order.
    pub fn links_of(&self, netns: &str) -> Vec<Link> {
        self.state()
            .namespaces
            .get(Path::new(netns))
            .map(|ls| ls.iter().map(|l| l.link.clone()).collect())
            .unwrap_or_default()
    }

    /// The link called `name` in `netns`.
    pub fn link(&self, netns: &str, name: &str) -> Option<Link> {
        self.links_of(netns).into_iter().find(|l| l.name == name)
    }

    /// The addresses of link `name` in `netns`.
    pub fn addrs_of(&self, netns: &str, name: &str) -> Vec<(IpAddr, u8)> {
        let st = self.state();
        st.namespaces
            .get(Path::new(netns))
            .and_then(|ls| ls.iter().find(|l| l.link.name == name))
            .map(|l| l.addrs.clone())
            .unwrap_or_default()
    }

    /// The value last written to sysctl `key` in `netns`.
    pub fn sysctl(&self, netns: &str, key: &str) -> Option<String> {
        self.state()
            .sysctls
            .get(&(PathBuf::from(netns), key.to_string()))
            .cloned()
    }

    /// Who `/dev/tapN` at `path` was given to.
    pub fn owner_of(&self, path: &str) -> Option<(u32, u32)> {
        self.state().chowned.get(Path::new(path)).copied()
    }

    /// Counts a call of `op`, records it, and returns the injected errno if
    /// this call is to fail. A hook for this call runs first; a change
    /// waits for a move half done to finish (the RTNL lock). Another
    /// process's calls are recorded apart and never fail.
    fn begin(&self, op: Op, netns: &Path, target: &str) -> Option<Errno> {
        let other = self.state().other > 0;
        if !other {
            let next = self.state().counts.get(&op).copied().unwrap_or(0) + 1;
            if !matches!(self.state().life, Life::Dead { .. }) {
                if let Some(act) = self.take_hook(op, next, false) {
                    self.act_as_other(act);
                }
            }
        }
        let mut st = self.state();
        if op.changes_links() {
            st.finish_transit();
        }
        if other {
            st.other_calls.push(Call {
                op,
                netns: netns.to_path_buf(),
                target: target.to_string(),
                failed: None,
            });
            return None;
        }
        if let Life::Dead { tried } = &mut st.life {
            *tried += 1;
            st.calls.push(Call {
                op,
                netns: netns.to_path_buf(),
                target: target.to_string(),
                failed: Some(Errno::ESRCH),
            });
            return Some(Errno::ESRCH);
        }
        let n = {
            let c = st.counts.entry(op).or_insert(0);
            *c += 1;
            *c
        };
        let failed = st
            .failures
            .iter()
            .find(|(o, nth, _)| *o == op && *nth == n)
            .map(|(_, _, e)| *e);
        if st.life == Life::DiesAfter(op, n) {
            st.life = Life::Dying;
        }
        st.calls.push(Call {
            op,
            netns: netns.to_path_buf(),
            target: target.to_string(),
            failed,
        });
        failed
    }

    /// Ends a served call: returns `result`, unless this call was the last
    /// one of a dying process ([`FakeKernel::crash_after`]); then the run
    /// unwinds with [`Crashed`] instead (without the panic hook's message).
    fn served<T>(&self, result: T) -> T {
        let dying = {
            let mut st = self.state();
            let dying = st.life == Life::Dying && st.other == 0;
            if dying {
                st.life = Life::Dead { tried: 0 };
            }
            dying
        };
        if dying {
            drop(result);
            std::panic::resume_unwind(Box::new(Crashed));
        }
        result
    }

    /// Marks the last call as failed with `errno` (a failure the model
    /// itself produced) and returns the error.
    fn refuse(&self, op: Op, what: String, errno: Errno) -> Error {
        let mut st = self.state();
        let calls = if st.other > 0 {
            &mut st.other_calls
        } else {
            &mut st.calls
        };
        if let Some(last) = calls.last_mut() {
            last.failed = Some(errno);
        }
        drop(st);
        Error::Netlink {
            op,
            what,
            source: errno,
        }
    }
}

impl State {
    /// devtmpfs on `NETDEV_REGISTER`: the macvtap's node, unless a node of
    /// that name exists (another namespace's macvtap with the same ifindex).
    fn make_node(&mut self, l: &FakeLink) {
        if l.link.is_macvtap() {
            self.tap_nodes.entry(l.link.index).or_insert(l.id);
        }
    }

    /// devtmpfs on `NETDEV_UNREGISTER`: the macvtap's node goes, if it is
    /// its own.
    fn drop_node(&mut self, l: &FakeLink) {
        if self.tap_nodes.get(&l.link.index) == Some(&l.id) {
            self.tap_nodes.remove(&l.link.index);
        }
    }

    /// The second half of a move half done: the link in its new namespace,
    /// its node made again.
    fn finish_transit(&mut self) {
        if let Some(t) = self.transit.take() {
            self.make_node(&t.link);
            self.namespaces.entry(t.to).or_default().push(t.link);
        }
    }

    fn free_index(&self, netns: &Path, from: u32) -> u32 {
        let used = |i: u32| {
            self.namespaces
                .get(netns)
                .is_some_and(|ls| ls.iter().any(|l| l.link.index == i))
        };
        // Indices are unique per namespace; a fresh one is also fresh
        // everywhere, as the kernel's counter makes it.
        let max_anywhere = self
            .namespaces
            .values()
            .flatten()
            .map(|l| l.link.index)
            .max()
            .unwrap_or(1);
        (from.max(max_anywhere + 1)..)
            .find(|i| !used(*i))
            .unwrap_or(u32::MAX)
    }
}

/// The links of one fake namespace.
struct FakeLinks<'a> {
    kernel: &'a FakeKernel,
    netns: PathBuf,
}

impl FakeLinks<'_> {
    fn what(&self, verb: &str, target: impl std::fmt::Display) -> String {
        format!("{verb} {target} in {}", self.netns.display())
    }

    fn check(&self, op: Op, target: &str, what: impl Fn() -> String) -> Result<()> {
        match self.kernel.begin(op, &self.netns, target) {
            Some(errno) => Err(Error::Netlink {
                op,
                what: what(),
                source: errno,
            }),
            None => Ok(()),
        }
    }

    fn find(&self, pred: impl Fn(&Link) -> bool) -> Option<Link> {
        self.kernel
            .state()
            .namespaces
            .get(&self.netns)
            .and_then(|ls| ls.iter().find(|l| pred(&l.link)).map(|l| l.link.clone()))
    }

    fn with_link<T>(
        &self,
        op: Op,
        index: u32,
        what: &dyn Fn() -> String,
        f: impl FnOnce(&mut FakeLink) -> T,
    ) -> Result<T> {
        let mut st = self.kernel.state();
        let found = st
            .namespaces
            .get_mut(&self.netns)
            .and_then(|ls| ls.iter_mut().find(|l| l.link.index == index));
        match found {
            Some(l) => Ok(f(l)),
            None => {
                drop(st);
                Err(self.kernel.refuse(op, what(), Errno::ENODEV))
            }
        }
    }
}

/// The link calls as served, before [`FakeKernel::served`] decides whether
/// the process lives on.
impl FakeLinks<'_> {
    fn get_link_op(&self, name: &str) -> Result<Option<Link>> {
        self.check(Op::GetLink, name, || self.what("looking up link", name))?;
        Ok(self.find(|l| l.name == name))
    }

    fn get_link_by_index_op(&self, index: u32) -> Result<Option<Link>> {
        self.check(Op::GetLink, &index.to_string(), || {
            self.what("looking up link index", index)
        })?;
        Ok(self.find(|l| l.index == index))
    }

    fn list_links_op(&self) -> Result<Vec<Link>> {
        self.check(Op::ListLinks, "", || {
            format!("listing links in {}", self.netns.display())
        })?;
        Ok(self
            .kernel
            .links_of(&self.netns.to_string_lossy())
            .into_iter()
            .collect())
    }

    fn add_macvtap_at_op(
        &self,
        name: &str,
        lower_index: u32,
        mode: MacvtapMode,
        txqueuelen: Option<u32>,
        index: Option<u32>,
    ) -> Result<Link> {
        let what = || self.what(&format!("creating {mode} macvtap"), name);
        self.check(Op::AddMacvtap, name, what)?;
        let Some(lower) = self.find(|l| l.index == lower_index) else {
            return Err(self.kernel.refuse(Op::AddMacvtap, what(), Errno::ENODEV));
        };
        if self.find(|l| l.name == name).is_some() {
            return Err(self.kernel.refuse(Op::AddMacvtap, what(), Errno::EEXIST));
        }
        if let Some(i) = index {
            if self.find(|l| l.index == i).is_some() {
                return Err(self.kernel.refuse(Op::AddMacvtap, what(), Errno::EBUSY));
            }
        }
        let netns = self.netns.to_string_lossy().into_owned();
        let index = match index {
            Some(i) => i,
            None => self.kernel.state().free_index(&self.netns, 2),
        };
        Ok(self.kernel.insert_link(
            &netns,
            Link {
                index,
                name: name.to_string(),
                kind: Some("macvtap".into()),
                mac: Some([0x02, 0, 0, 0, (index >> 8) as u8, index as u8]),
                mtu: lower.mtu,
                oper_state: "down".into(),
                lower_index: Some(lower_index),
                macvtap_mode: Some(mode),
                txqueuelen: txqueuelen.unwrap_or(lower.txqueuelen),
                ..Default::default()
            },
        ))
    }

    fn del_link_op(&self, index: u32, name: &str) -> Result<()> {
        let what = || self.what("deleting link", format!("{name} (index {index})"));
        self.check(Op::DelLink, name, what)?;
        let mut st = self.kernel.state();
        let ls = st.namespaces.entry(self.netns.clone()).or_default();
        match ls.iter().position(|l| l.link.index == index) {
            Some(pos) => {
                let gone = ls.remove(pos);
                st.drop_node(&gone);
                Ok(())
            }
            None => {
                drop(st);
                Err(self.kernel.refuse(Op::DelLink, what(), Errno::ENODEV))
            }
        }
    }

    fn set_link_ns_at_op(
        &self,
        index: u32,
        name: &str,
        target: &Netns,
        new_name: &str,
        new_index: u32,
    ) -> Result<()> {
        let what = || {
            format!(
                "moving link {name} (index {index}) from {} into {} as {new_name} with ifindex \
                 {new_index}",
                self.netns.display(),
                target.path().display()
            )
        };
        self.check(Op::MoveLink, name, what)?;
        let mut st = self.kernel.state();
        let to = target.path().to_path_buf();
        if !st.namespaces.contains_key(&to) {
            drop(st);
            return Err(self.kernel.refuse(Op::MoveLink, what(), Errno::EINVAL));
        }
        let Some(pos) = st
            .namespaces
            .get(&self.netns)
            .and_then(|ls| ls.iter().position(|l| l.link.index == index))
        else {
            drop(st);
            return Err(self.kernel.refuse(Op::MoveLink, what(), Errno::ENODEV));
        };
        let taken = |st: &State, f: &dyn Fn(&Link) -> bool| {
            st.namespaces
                .get(&to)
                .is_some_and(|ls| ls.iter().any(|l| f(&l.link)))
        };
        let index_in_target = if st.ignore_new_ifindex {
            if taken(&st, &|l| l.index == index) {
                st.free_index(&to, 2)
            } else {
                index
            }
        } else if taken(&st, &|l| l.index == new_index) {
            drop(st);
            return Err(self.kernel.refuse(Op::MoveLink, what(), Errno::EBUSY));
        } else {
            new_index
        };
        let mut rename_failed = false;
        if taken(&st, &|l| l.name == new_name) {
            if !st.move_then_rename || taken(&st, &|l| l.name == name) {
                drop(st);
                return Err(self.kernel.refuse(Op::MoveLink, what(), Errno::EEXIST));
            }
            rename_failed = true;
        }
        let Some(ls) = st.namespaces.get_mut(&self.netns) else {
            return Err(self.kernel.refuse(Op::MoveLink, what(), Errno::ENODEV));
        };
        let mut moving = ls.remove(pos);
        st.drop_node(&moving);
        moving.link.index = index_in_target;
        if !rename_failed {
            moving.link.name = new_name.to_string();
        }
        // Moving closes the link and flushes its addresses and routes.
        moving.link.flags &= !(nix::libc::IFF_UP as u32);
        moving.link.oper_state = "down".into();
        moving.link.lower_in_other_netns = to != Path::new(HOST);
        moving.addrs.clear();
        moving.routes.clear();
        st.transit = Some(Transit { link: moving, to });
        let nth = st.counts.get(&Op::MoveLink).copied().unwrap_or(0);
        let mine = st.other == 0;
        drop(st);
        if mine {
            if let Some(act) = self.kernel.take_hook(Op::MoveLink, nth, true) {
                self.kernel.act_as_other(act);
            }
        }
        self.kernel.state().finish_transit();
        if rename_failed {
            return Err(self.kernel.refuse(Op::MoveLink, what(), Errno::EEXIST));
        }
        Ok(())
    }

    fn set_link_op(&self, index: u32, name: &str, change: &LinkChange) -> Result<()> {
        let what = || format!("{change} on {name} in {}", self.netns.display());
        self.check(Op::SetLink, name, what)?;
        let st = self.kernel.state();
        let Some(me) = st
            .namespaces
            .get(&self.netns)
            .and_then(|ls| ls.iter().find(|l| l.link.index == index))
            .map(|l| (l.id, l.link.lower_index, l.link.is_macvtap()))
        else {
            drop(st);
            return Err(self.kernel.refuse(Op::SetLink, what(), Errno::ENODEV));
        };
        if let (Some(mac), (id, Some(lower), true)) = (change.mac, me) {
            let clash = st.namespaces.values().flatten().any(|l| {
                l.id != id
                    && l.link.is_macvtap()
                    && l.link.lower_index == Some(lower)
                    && l.link.mac == Some(mac)
            });
            if clash {
                drop(st);
                return Err(self.kernel.refuse(Op::SetLink, what(), Errno::EADDRINUSE));
            }
        }
        if let Some(n) = &change.name {
            let clash = st
                .namespaces
                .get(&self.netns)
                .is_some_and(|ls| ls.iter().any(|l| l.link.name == *n && l.id != me.0));
            if clash {
                drop(st);
                return Err(self.kernel.refuse(Op::SetLink, what(), Errno::EEXIST));
            }
        }
        drop(st);
        self.with_link(Op::SetLink, index, &what, |l| {
            let link = &mut l.link;
            let set_flag = |flags: &mut u32, flag: i32, on: bool| {
                if on {
                    *flags |= flag as u32;
                } else {
                    *flags &= !(flag as u32);
                }
            };
            if let Some(m) = change.mtu {
                link.mtu = m;
            }
            if let Some(m) = change.mac {
                link.mac = Some(m);
            }
            if let Some(up) = change.up {
                set_flag(&mut link.flags, nix::libc::IFF_UP, up);
                link.oper_state = if up { "up" } else { "down" }.into();
            }
            if let Some(p) = change.promisc {
                set_flag(&mut link.flags, nix::libc::IFF_PROMISC, p);
            }
            if let Some(n) = &change.name {
                link.name = n.clone();
            }
            if let Some(a) = &change.alias {
                link.alias = (!a.is_empty()).then(|| a.clone());
            }
        })
    }

    fn add_addr_op(&self, index: u32, addr: IpAddr, prefix_len: u8) -> Result<()> {
        let what = || {
            self.what(
                &format!("adding address {addr}/{prefix_len} to link index"),
                index,
            )
        };
        self.check(Op::AddAddr, &addr.to_string(), what)?;
        let added = self.with_link(Op::AddAddr, index, &what, |l| {
            if l.addrs.contains(&(addr, prefix_len)) {
                false
            } else {
                l.addrs.push((addr, prefix_len));
                true
            }
        })?;
        if added {
            Ok(())
        } else {
            Err(self.kernel.refuse(Op::AddAddr, what(), Errno::EEXIST))
        }
    }

    fn list_addrs_op(&self, index: u32) -> Result<Vec<(IpAddr, u8)>> {
        let what = || self.what("listing addresses of link index", index);
        self.check(Op::ListAddrs, &index.to_string(), what)?;
        Ok(self
            .kernel
            .state()
            .namespaces
            .get(&self.netns)
            .and_then(|ls| ls.iter().find(|l| l.link.index == index))
            .map(|l| l.addrs.clone())
            .unwrap_or_default())
    }

    fn add_route_op(
        &self,
        index: u32,
        dst: IpAddr,
        prefix_len: u8,
        gw: Option<IpAddr>,
    ) -> Result<()> {
        let what = || {
            self.what(
                &format!("adding route {dst}/{prefix_len} on link index"),
                index,
            )
        };
        self.check(Op::AddRoute, &dst.to_string(), what)?;
        self.with_link(Op::AddRoute, index, &what, |l| {
            l.routes.push((dst, prefix_len, gw))
        })
    }
}

impl Links for FakeLinks<'_> {
    fn netns(&self) -> &Path {
        &self.netns
    }

    fn get_link(&self, name: &str) -> Result<Option<Link>> {
        self.kernel.served(self.get_link_op(name))
    }

    fn get_link_by_index(&self, index: u32) -> Result<Option<Link>> {
        self.kernel.served(self.get_link_by_index_op(index))
    }

    fn list_links(&self) -> Result<Vec<Link>> {
        self.kernel.served(self.list_links_op())
    }

    fn add_macvtap_at(
        &self,
        name: &str,
        lower_index: u32,
        mode: MacvtapMode,
        txqueuelen: Option<u32>,
        index: Option<u32>,
    ) -> Result<Link> {
        self.kernel
            .served(self.add_macvtap_at_op(name, lower_index, mode, txqueuelen, index))
    }

    fn del_link(&self, index: u32, name: &str) -> Result<()> {
        self.kernel.served(self.del_link_op(index, name))
    }

    fn set_link_ns_at(
        &self,
        index: u32,
        name: &str,
        target: &Netns,
        new_name: &str,
        new_index: u32,
    ) -> Result<()> {
        self.kernel
            .served(self.set_link_ns_at_op(index, name, target, new_name, new_index))
    }

    fn set_link(&self, index: u32, name: &str, change: &LinkChange) -> Result<()> {
        self.kernel.served(self.set_link_op(index, name, change))
    }

    fn add_addr(&self, index: u32, addr: IpAddr, prefix_len: u8) -> Result<()> {
        self.kernel
            .served(self.add_addr_op(index, addr, prefix_len))
    }

    fn list_addrs(&self, index: u32) -> Result<Vec<(IpAddr, u8)>> {
        self.kernel.served(self.list_addrs_op(index))
    }

    fn add_route(&self, index: u32, dst: IpAddr, prefix_len: u8, gw: Option<IpAddr>) -> Result<()> {
        self.kernel
            .served(self.add_route_op(index, dst, prefix_len, gw))
    }
}

/// The kernel calls as served, before `FakeKernel::served` decides
/// whether the process lives on.
impl FakeKernel {
    fn current_netns_op(&self) -> Result<Netns> {
        self.open_netns_op(Path::new(HOST))
    }

    fn open_netns_op(&self, path: &Path) -> Result<Netns> {
        let errno = self.begin(Op::OpenNetns, path, &path.to_string_lossy());
        let exists = self.state().namespaces.contains_key(path);
        match (errno, exists) {
            // Only the path means anything: entering /dev/null fails.
            (None, true) => File::open("/dev/null")
                .map(|null| Netns::from_fd(null.into(), path))
                .map_err(|source| Error::OpenNetns {
                    path: path.to_path_buf(),
                    source,
                }),
            (e, _) => Err(Error::OpenNetns {
                path: path.to_path_buf(),
                source: std::io::Error::from_raw_os_error(e.unwrap_or(Errno::ENOENT) as i32),
            }),
        }
    }

    fn links_op<'a>(&'a self, netns: Option<&Netns>) -> Result<Box<dyn Links + Send + 'a>> {
        let path = netns.map_or_else(|| PathBuf::from(HOST), |n| n.path().to_path_buf());
        if let Some(errno) = self.begin(Op::OpenSocket, &path, "") {
            return Err(Error::Socket(std::io::Error::from_raw_os_error(
                errno as i32,
            )));
        }
        Ok(Box::new(FakeLinks {
            kernel: self,
            netns: path,
        }))
    }

    fn write_sysctl_op(&self, netns: &Netns, key: &str, value: &str) -> Result<()> {
        let path = netns.path().to_path_buf();
        let err = |errno: Errno| Error::Sysctl {
            key: key.to_string(),
            netns: path.clone(),
            source: std::io::Error::from_raw_os_error(errno as i32),
        };
        if let Some(errno) = self.begin(Op::Sysctl, &path, key) {
            return Err(err(errno));
        }
        self.state()
            .sysctls
            .insert((path.clone(), key.to_string()), value.to_string());
        Ok(())
    }

    fn tap_device_op(&self, netns: &Netns, ifname: &str) -> Result<(u64, u64)> {
        let path = netns.path().to_path_buf();
        let err = |msg: String| Error::Sysfs {
            ifname: ifname.to_string(),
            netns: path.clone(),
            msg,
        };
        if let Some(errno) = self.begin(Op::TapDevice, &path, ifname) {
            return Err(err(errno.desc().to_string()));
        }
        let st = self.state();
        let link = st
            .namespaces
            .get(&path)
            .and_then(|ls| ls.iter().find(|l| l.link.name == ifname));
        match link {
            Some(l) if l.link.is_macvtap() => Ok((TAP_MAJOR, l.id)),
            Some(_) => Err(err(format!(
                "/sys/class/net/{ifname}/macvtap: {}",
                Errno::ENOENT.desc()
            ))),
            None => Err(err(format!(
                "/sys/class/net/{ifname}: {}",
                Errno::ENOENT.desc()
            ))),
        }
    }

    fn open_tap_node_op(&self, path: &Path, dev: (u64, u64), _wait: Duration) -> Result<TapNode> {
        if let Some(errno) = self.begin(Op::OpenTapNode, path, &path.to_string_lossy()) {
            return Err(Error::TapNode {
                path: path.to_path_buf(),
                msg: errno.desc().to_string(),
            });
        }
        // The node is the device of the link devtmpfs made it for, in
        // whichever namespace that link is.
        let index = tap_index(path);
        let matches = index
            .and_then(|i| self.state().tap_nodes.get(&i).copied())
            .is_some_and(|id| (TAP_MAJOR, id) == dev);
        if matches {
            // The fake's chown never touches it: /dev/null stands for the node.
            File::open("/dev/null")
                .map(|null| TapNode::opened(path, null))
                .map_err(|e| Error::TapNode {
                    path: path.to_path_buf(),
                    msg: e.to_string(),
                })
        } else {
            if let Some(last) = self.state().calls.last_mut() {
                last.failed = Some(Errno::ENOENT);
            }
            Err(Error::TapNode {
                path: path.to_path_buf(),
                msg: format!(
                    "is not the link's tap device {}:{} (no such node, or another link's)",
                    dev.0, dev.1
                ),
            })
        }
    }

    fn tap_node_op(&self, path: &Path) -> Result<Option<(u64, u64)>> {
        if let Some(errno) = self.begin(Op::StatTapNode, path, &path.to_string_lossy()) {
            return Err(Error::TapNode {
                path: path.to_path_buf(),
                msg: errno.desc().to_string(),
            });
        }
        let index = tap_index(path);
        Ok(index.and_then(|i| self.tap_node(i)))
    }

    fn chown_tap_node_op(&self, node: &TapNode, owner: u32, group: u32) -> Result<()> {
        let path = node.path().to_path_buf();
        if let Some(errno) = self.begin(Op::ChownTapNode, &path, &path.to_string_lossy()) {
            return Err(Error::TapNode {
                path,
                msg: format!("giving it to {owner}:{group}: {}", errno.desc()),
            });
        }
        self.state().chowned.insert(path, (owner, group));
        Ok(())
    }
}

impl Kernel for FakeKernel {
    fn current_netns(&self) -> Result<Netns> {
        self.served(self.current_netns_op())
    }

    fn open_netns(&self, path: &Path) -> Result<Netns> {
        self.served(self.open_netns_op(path))
    }

    fn links<'a>(&'a self, netns: Option<&Netns>) -> Result<Box<dyn Links + Send + 'a>> {
        self.served(self.links_op(netns))
    }

    fn write_sysctl(&self, netns: &Netns, key: &str, value: &str) -> Result<()> {
        self.served(self.write_sysctl_op(netns, key, value))
    }

    fn tap_device(&self, netns: &Netns, ifname: &str) -> Result<(u64, u64)> {
        self.served(self.tap_device_op(netns, ifname))
    }

    fn open_tap_node(&self, path: &Path, dev: (u64, u64), wait: Duration) -> Result<TapNode> {
        self.served(self.open_tap_node_op(path, dev, wait))
    }

    fn tap_node(&self, path: &Path) -> Result<Option<(u64, u64)>> {
        self.served(self.tap_node_op(path))
    }

    fn chown_tap_node(&self, node: &TapNode, owner: u32, group: u32) -> Result<()> {
        self.served(self.chown_tap_node_op(node, owner, group))
    }
}

/// The ifindex a tap node's path names: `/dev/tap40` → 40.
fn tap_index(path: &Path) -> Option<u32> {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("tap"))
        .and_then(|n| n.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "/run/netns/pod";

    fn setup() -> (FakeKernel, Link) {
        let k = FakeKernel::new();
        k.add_netns(POD);
        let nic = k.add_nic(HOST, "lower0");
        (k, nic)
    }

    #[test]
    fn a_move_keeps_the_index_or_is_refused_with_ebusy() {
        let (k, nic) = setup();
        let host = k.links(None).unwrap();
        let m = host
            .add_macvtap_at("mvt1", nic.index, MacvtapMode::Bridge, None, None)
            .unwrap();
        let pod = k.open_netns(Path::new(POD)).unwrap();
        k.insert_link(
            POD,
            Link {
                index: m.index,
                name: "blk0".into(),
                ..Default::default()
            },
        );
        let e = host.set_link_ns(m.index, "mvt1", &pod, "net1").unwrap_err();
        assert_eq!(e.errno(), Some(Errno::EBUSY));
        assert!(k.link(HOST, "mvt1").is_some(), "nothing moved");
        k.ignore_new_ifindex();
        host.set_link_ns(m.index, "mvt1", &pod, "net1").unwrap();
        let moved = k.link(POD, "net1").unwrap();
        assert_ne!(moved.index, m.index, "an old kernel gives a new index");
        assert_eq!(k.link(POD, "blk0").unwrap().index, m.index);
    }

    #[test]
    fn injected_failures_hit_the_nth_call_and_are_recorded() {
        let (k, nic) = setup();
        k.fail(Op::GetLink, 2, Errno::EIO);
        let host = k.links(None).unwrap();
        assert!(host.get_link("lower0").unwrap().is_some());
        let e = host.get_link("lower0").unwrap_err();
        assert_eq!(e.op(), Some(Op::GetLink));
        assert_eq!(
            e.to_string(),
            format!("looking up link lower0 in {HOST}: I/O error (EIO)")
        );
        assert!(host.get_link_by_index(nic.index).unwrap().is_some());
        let failed: Vec<_> = k
            .calls()
            .into_iter()
            .filter(|c| c.failed.is_some())
            .collect();
        assert_eq!(failed.len(), 1);
        assert_eq!(k.count(Op::GetLink), 3);
    }

    #[test]
    fn a_mac_another_macvtap_on_the_lower_uses_is_eaddrinuse() {
        let (k, nic) = setup();
        let host = k.links(None).unwrap();
        let a = host
            .add_macvtap_at("mvta", nic.index, MacvtapMode::Bridge, None, None)
            .unwrap();
        let b = host
            .add_macvtap_at("mvtb", nic.index, MacvtapMode::Bridge, None, None)
            .unwrap();
        let change = LinkChange {
            mac: a.mac,
            ..Default::default()
        };
        let e = host.set_link(b.index, "mvtb", &change).unwrap_err();
        assert_eq!(e.errno(), Some(Errno::EADDRINUSE));
        assert!(
            e.to_string()
                .contains("another macvtap on the same lower NIC already uses this MAC"),
            "{e}"
        );
    }

    #[test]
    fn a_crash_lets_the_call_take_effect_and_refuses_every_later_one() {
        let (k, nic) = setup();
        let pod = k.open_netns(Path::new(POD)).unwrap();
        let host = k.links(None).unwrap();
        let m = host
            .add_macvtap_at("mvt1", nic.index, MacvtapMode::Bridge, None, None)
            .unwrap();
        k.crash_after(Op::MoveLink, 1);
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = host.set_link_ns(m.index, "mvt1", &pod, "net1");
            unreachable!("the run goes on after its crash point");
        }));
        let payload = run.unwrap_err();
        assert_eq!(payload.downcast_ref::<Crashed>(), Some(&Crashed));
        assert!(k.crashed());
        assert_eq!(
            k.link(POD, "net1").unwrap().index,
            m.index,
            "the move took effect"
        );
        let e = host.get_link("lower0").unwrap_err();
        assert_eq!(e.errno(), Some(Errno::ESRCH));
        assert!(
            k.link(POD, "net1").is_some(),
            "a refused call changes nothing"
        );
        assert_eq!(k.calls_after_death(), 1);
        k.restart();
        assert!(!k.crashed());
        assert!(host.get_link("lower0").unwrap().is_some());
    }

    #[test]
    fn a_namespace_that_goes_destroys_its_macvtap_and_returns_a_nic() {
        let (k, nic) = setup();
        let pod = k.open_netns(Path::new(POD)).unwrap();
        let host = k.links(None).unwrap();
        let m = host
            .add_macvtap_at("mvt1", nic.index, MacvtapMode::Bridge, None, None)
            .unwrap();
        host.set_link_ns(m.index, "mvt1", &pod, "net1").unwrap();
        let phys = k.insert_link(
            POD,
            Link {
                name: "lower0".into(),
                flags: nix::libc::IFF_UP as u32,
                ..Default::default()
            },
        );
        let dev = k.tap_device(&pod, "net1").unwrap();
        let node = format!("/dev/tap{}", m.index);
        let tap = Duration::ZERO;
        k.open_tap_node(Path::new(&node), dev, tap).unwrap();
        k.remove_netns(POD);
        assert_eq!(k.links_of(POD), vec![]);
        let e = k.open_tap_node(Path::new(&node), dev, tap).unwrap_err();
        assert!(e.to_string().contains("no such node"), "{e}");
        // The NIC's name is taken on the host: it comes back as dev<N>.
        let back = k.link(HOST, &format!("dev{}", phys.index)).unwrap();
        assert!(!back.is_up());
        assert_eq!(k.links_of(HOST).len(), 2, "lower0 and the returned NIC");
    }

    #[test]
    fn a_tap_node_follows_its_macvtap_and_belongs_to_the_first_of_an_index() {
        let (k, nic) = setup();
        let pod = k.open_netns(Path::new(POD)).unwrap();
        let host = k.links(None).unwrap();
        let m = host
            .add_macvtap_at("mvt1", nic.index, MacvtapMode::Bridge, None, None)
            .unwrap();
        let dev = k.tap_device(&k.current_netns().unwrap(), "mvt1").unwrap();
        assert_eq!(k.tap_node(m.index), Some(dev));
        host.set_link_ns(m.index, "mvt1", &pod, "net1").unwrap();
        assert_eq!(k.tap_node(m.index), Some(dev), "made again in the pod");
        // A second macvtap with the same ifindex in another namespace gets
        // no node: the name is the first one's.
        let twin = host
            .add_macvtap_at("mvt2", nic.index, MacvtapMode::Bridge, None, Some(m.index))
            .unwrap();
        assert_eq!(twin.index, m.index);
        assert_eq!(k.tap_node(m.index), Some(dev));
        let node = PathBuf::from(format!("/dev/tap{}", m.index));
        let twin_dev = k.tap_device(&k.current_netns().unwrap(), "mvt2").unwrap();
        assert!(k.open_tap_node(&node, twin_dev, Duration::ZERO).is_err());
        assert_eq!(Kernel::tap_node(&k, &node).unwrap(), Some(dev));
        k.remove_netns(POD);
        assert_eq!(
            k.tap_node(m.index),
            None,
            "gone with the first; never the twin's"
        );
        host.del_link(twin.index, "mvt2").unwrap();
        assert_eq!(k.tap_node(m.index), None);
    }

    #[test]
    fn amid_a_move_the_link_is_nowhere_and_a_change_waits_for_the_move() {
        let (k, nic) = setup();
        let k = std::sync::Arc::new(k);
        let pod = k.open_netns(Path::new(POD)).unwrap();
        let host = k.links(None).unwrap();
        let m = host
            .add_macvtap_at("mvt1", nic.index, MacvtapMode::Bridge, None, None)
            .unwrap();
        let dev = k.tap_device(&k.current_netns().unwrap(), "mvt1").unwrap();
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let (k2, seen2) = (k.clone(), seen.clone());
        k.amid_move(1, move || {
            let other = k2.links(None).unwrap();
            seen2.lock().unwrap().push((
                other.get_link_by_index(m.index).unwrap().is_some(),
                k2.link(POD, "net1").is_some(),
                k2.tap_node(m.index).is_some(),
            ));
            // A create takes the RTNL lock: the move finishes first, so the
            // index is free on the host and the pod's link has the node.
            other
                .add_macvtap_at("mvt2", nic.index, MacvtapMode::Bridge, None, Some(m.index))
                .unwrap();
            seen2.lock().unwrap().push((
                k2.link(HOST, "mvt2").is_some(),
                k2.link(POD, "net1").is_some(),
                k2.tap_node(m.index) == Some(dev),
            ));
        });
        host.set_link_ns(m.index, "mvt1", &pod, "net1").unwrap();
        assert_eq!(
            *seen.lock().unwrap(),
            [(false, false, false), (true, true, true)],
            "nowhere, no node; then moved, the node the pod link's and not the twin's"
        );
        assert_eq!(k.count(Op::MoveLink), 1);
        assert_eq!(
            k.count(Op::AddMacvtap),
            1,
            "the other process's create is not the run's"
        );
        assert_eq!(
            k.other_calls().iter().map(|c| c.op).collect::<Vec<_>>(),
            [Op::OpenSocket, Op::GetLink, Op::AddMacvtap]
        );
    }

    #[test]
    fn another_process_acts_before_a_call_and_is_never_killed_with_the_run() {
        let (k, nic) = setup();
        let k = std::sync::Arc::new(k);
        let host = k.links(None).unwrap();
        let m = host
            .add_macvtap_at("mvt1", nic.index, MacvtapMode::Bridge, None, None)
            .unwrap();
        let k2 = k.clone();
        k.before(Op::GetLink, 1, move || {
            let other = k2.links(None).unwrap();
            other.del_link(m.index, "mvt1").unwrap();
        });
        k.crash_after(Op::GetLink, 1);
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            host.get_link("mvt1").unwrap()
        }));
        assert!(run.is_err(), "the run died after its call");
        assert!(k.link(HOST, "mvt1").is_none(), "deleted before the call");
        assert_eq!(k.tap_node(m.index), None);
        assert_eq!(k.count(Op::DelLink), 0);
        assert_eq!(k.calls_after_death(), 0);
    }
}
