//! Running the guest on a macvtap inside a pod namespace as virt-launcher's
//! stack does it: one shared emulation of virt-launcher (KubeVirt ≥ 1.1,
//! non-root, macvtap binding plugin with `domainAttachmentType: tap`).
//!
//! What it reproduces, and from where (kubevirt/kubevirt):
//! - virt-launcher and everything it starts run as uid/gid 107
//!   (`pkg/util/util.go` `NonRootUID = 107`); the CNI gives `/dev/tapN` to
//!   107 by default, so QEMU and libvirt open it as that user here too
//!   ([`QEMU_UID`], `setpriv`).
//! - libvirt runs unprivileged in session mode with virt-launcher's
//!   `qemu.conf` copied to its config home
//!   (`pkg/virt-launcher/virtwrap/util/libvirt_helper.go` `SetupLibvirt`,
//!   `qemuNonRootConfPath`; `cmd/virt-launcher/qemu.conf`: `user`/`group`
//!   `qemu`, `dynamic_ownership = 1`, `remember_owner = 0`, no namespaces,
//!   no cgroup controllers). `stdio_handler` is `file` here, not `logd`:
//!   virtlogd is not started.
//! - The domain's NIC is `<interface type='ethernet'>` with `<target
//!   dev='<pod ifname>' managed='no'/>`, its `<mac>` the VM's `macAddress`
//!   or else the pod link's own MAC, and `<mtu size>` the pod link's MTU
//!   (`pkg/network/domainspec/generators.go`,
//!   `MacvtapLibvirtSpecGenerator.discoverDomainIfaceSpec`). libvirt opens
//!   the macvtap's `/dev/tapN` itself, once per queue, and never sets its
//!   MAC or state.
//! - Multiqueue gives the interface `<driver name='vhost' queues=N>`, N from
//!   the vCPUs (`pkg/virt-launcher/virtwrap/converter`,
//!   `CalculateNetworkQueues`). This host has no `/dev/vhost-net`, so the
//!   emulation leaves out `name='vhost'` (QEMU's userspace virtio-net, same
//!   queues, same tap fds) and gives the VM as many vCPUs as queues.
//!
//! [`run_qemu`] is the short path the data path needs: QEMU (as 107) given
//! an open `/dev/tapN` as fd 3.

use crate::guest::{Guest, PING_FAIL, PING_OK};
use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What the guest is told on its kernel command line.
#[derive(Debug, Clone)]
pub struct GuestNet {
    /// The guest NIC's MAC.
    pub mac: String,
    /// Address with prefix for `eth0`, e.g. `192.0.2.2/24`.
    pub ip: String,
    /// Address to ping.
    pub peer: String,
    /// How many one-second pings to try before giving up.
    pub tries: u32,
}

impl GuestNet {
    fn cmdline(&self) -> String {
        format!(
            "console=ttyS0 quiet panic=-1 vmtest.ip={} vmtest.peer={} vmtest.tries={}",
            self.ip, self.peer, self.tries
        )
    }
}

/// How a guest run ended.
#[derive(Debug, Clone)]
pub struct VmRun {
    /// The guest printed the ping-OK marker.
    pub ping_ok: bool,
    /// The serial console.
    pub console: String,
    /// From start to the guest's marker.
    pub to_marker: Option<Duration>,
    /// From start until QEMU exited (or the domain was gone).
    pub total: Duration,
    /// The processes that held the tap device open once QEMU held it.
    pub tap_holders: Vec<TapHolder>,
}

/// A process holding a tap device open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapHolder {
    /// Its pid.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// Its real uid.
    pub uid: u32,
    /// Its real gid.
    pub gid: u32,
    /// How many of its descriptors are the tap device.
    pub fds: usize,
}

/// Whether QEMU is among `holders` (libvirtd or the shell that starts QEMU
/// hold the tap only briefly before it).
fn held_by_qemu(holders: &[TapHolder]) -> bool {
    holders.iter().any(|h| h.comm.starts_with("qemu"))
}

/// The processes that have `tap` (a `/dev/tapN`) open now, from `/proc`.
pub fn tap_holders(tap: &Path) -> Vec<TapHolder> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut v = Vec::new();
    for pid in rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            continue;
        };
        let n = fds
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l == tap)
            .count();
        if n == 0 {
            continue;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |key: &str| -> u32 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|r| r.split_whitespace().next()?.parse().ok())
                .unwrap_or(u32::MAX)
        };
        v.push(TapHolder {
            pid,
            comm: std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .unwrap_or_default()
                .trim()
                .to_string(),
            uid: field("Uid:"),
            gid: field("Gid:"),
            fds: n,
        });
    }
    v
}

impl VmRun {
    /// The console lines the guest's `/init` printed.
    pub fn markers(&self) -> String {
        self.console
            .lines()
            .filter(|l| l.contains("VMTEST"))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

const BOOT_TIMEOUT: Duration = Duration::from_secs(180);

/// The uid and gid virt-launcher, libvirt and QEMU run as (KubeVirt's
/// `NonRootUID`), and the CNI's default owner of `/dev/tapN`.
pub const QEMU_UID: u32 = 107;

/// `setpriv` arguments that become uid/gid [`QEMU_UID`] with no other groups.
fn as_qemu_user() -> Vec<String> {
    vec![
        "setpriv".into(),
        format!("--reuid={QEMU_UID}"),
        format!("--regid={QEMU_UID}"),
        "--clear-groups".into(),
    ]
}

/// Gives `path` to [`QEMU_UID`] (a work dir QEMU writes into).
pub fn give_to_qemu(path: &Path) -> Result<()> {
    let id = Some(nix::unistd::Uid::from_raw(QEMU_UID));
    nix::unistd::chown(path, id, Some(nix::unistd::Gid::from_raw(QEMU_UID)))
        .with_context(|| format!("chown {} to {QEMU_UID}", path.display()))
}

/// A child process killed (TERM, then KILL) and reaped on drop.
pub struct Reaped {
    /// The child.
    pub child: Child,
    /// For messages.
    pub what: String,
}

impl Reaped {
    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the process: TERM, up to 5 s, then KILL.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How QEMU gets the guest NIC's host side.
#[derive(Debug, Clone)]
pub enum Netdev<'a> {
    /// An open `/dev/tapN` passed as fd 3, as virt-launcher does for macvtap.
    TapNode(&'a Path),
    /// A tap interface QEMU opens by name (KubeVirt's bridge binding).
    TapIfname(&'a str),
}

/// What [`Qemu::spawn_with`] adds to the common command line. Both ends of
/// a live migration must be started with the same machine and devices, so
/// only these differ between them.
#[derive(Debug, Clone)]
pub struct QemuExtras {
    /// Guest RAM in MiB.
    pub memory_mib: u32,
    /// A QMP socket QEMU serves (`-qmp unix:<path>,server=on,wait=off`).
    pub qmp: Option<PathBuf>,
    /// `-incoming <uri>`: wait for a live migration instead of booting.
    pub incoming: Option<String>,
}

impl Default for QemuExtras {
    fn default() -> Self {
        QemuExtras {
            memory_mib: 256,
            qmp: None,
            incoming: None,
        }
    }
}

impl QemuExtras {
    fn qemu_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(q) = &self.qmp {
            v.push("-qmp".to_string());
            v.push(format!("unix:{},server=on,wait=off", q.display()));
        }
        if let Some(i) = &self.incoming {
            v.push("-incoming".to_string());
            v.push(i.clone());
        }
        v
    }
}

/// A QEMU process booting the guest, with its serial console in a file.
pub struct Qemu {
    /// The process (killed on drop).
    pub process: Reaped,
    /// The serial console file.
    pub console: PathBuf,
    /// When it was started.
    pub start: Instant,
}

impl Qemu {
    /// Starts QEMU (TCG) in `pod_ns` as uid/gid [`QEMU_UID`] (which opens
    /// the tap; as root for a tap by name, see below), with the guest NIC on
    /// `netdev` and `extra` appended to the kernel command line; `work` is
    /// given to that user.
    pub fn spawn(
        pod_ns: &str,
        netdev: &Netdev,
        guest: &Guest,
        net: &GuestNet,
        extra: &str,
        work: &Path,
    ) -> Result<Self> {
        Self::spawn_with(
            pod_ns,
            netdev,
            guest,
            net,
            extra,
            work,
            &QemuExtras::default(),
        )
    }

    /// [`Qemu::spawn`] with the options of [`QemuExtras`] (guest RAM, a QMP
    /// socket, `-incoming` for the target of a live migration).
    pub fn spawn_with(
        pod_ns: &str,
        netdev: &Netdev,
        guest: &Guest,
        net: &GuestNet,
        extra: &str,
        work: &Path,
        extras: &QemuExtras,
    ) -> Result<Self> {
        let console = work.join(format!("qemu-{}.console", net.mac.replace(':', "")));
        let _ = std::fs::remove_file(&console);
        let (netdev_arg, tap) = match netdev {
            Netdev::TapNode(p) => (
                "tap,id=n0,fd=3".to_string(),
                p.to_string_lossy().into_owned(),
            ),
            Netdev::TapIfname(i) => (
                format!("tap,id=n0,ifname={i},script=no,downscript=no"),
                "/dev/null".to_string(),
            ),
        };
        give_to_qemu(work)?;
        // The bridge binding's QEMU opens /dev/net/tun, which KubeVirt grants
        // its launcher through the tun device plugin; on this host the node
        // is root's (0600), so that QEMU runs as root here.
        let user = match netdev {
            Netdev::TapNode(_) => as_qemu_user(),
            Netdev::TapIfname(_) => Vec::new(),
        };
        let start = Instant::now();
        let child = Command::new("ip")
            .args(["netns", "exec", pod_ns])
            .args(user)
            .args(["sh", "-c", r#"exec "$@" 3<>"$TAP""#, "sh"])
            .arg("qemu-system-x86_64")
            .args(["-accel", "tcg", "-m"])
            .arg(extras.memory_mib.max(1).to_string())
            .args(["-smp", "1", "-display", "none", "-monitor", "none"])
            .args(extras.qemu_args())
            .args(["-no-reboot", "-serial"])
            .arg(format!("file:{}", console.display()))
            .arg("-kernel")
            .arg(&guest.kernel)
            .arg("-initrd")
            .arg(&guest.initrd)
            .args(["-append", &format!("{} {extra}", net.cmdline())])
            .args(["-netdev", &netdev_arg, "-device"])
            .arg(format!("virtio-net-pci,netdev=n0,mac={},romfile=", net.mac))
            .env("TAP", tap)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
        Ok(Qemu {
            process: Reaped {
                child,
                what: "qemu".into(),
            },
            console,
            start,
        })
    }

    /// The console so far.
    pub fn console_text(&self) -> String {
        std::fs::read_to_string(&self.console).unwrap_or_default()
    }

    /// Waits for the guest to power off, calling `tick` with the console
    /// text about every 20 ms; returns how the run ended.
    pub fn wait(mut self, mut tick: impl FnMut(&str)) -> Result<VmRun> {
        let mut to_marker = None;
        loop {
            let text = self.console_text();
            tick(&text);
            if to_marker.is_none() && (text.contains(PING_OK) || text.contains(PING_FAIL)) {
                to_marker = Some(self.start.elapsed());
            }
            if let Some(status) = self.process.child.try_wait()? {
                // Decide from a read made after the exit, never from `text`,
                // read before it: the guest may have printed its marker in
                // between (then the marker time is this read's).
                let console_text = self.console_text();
                if to_marker.is_none()
                    && (console_text.contains(PING_OK) || console_text.contains(PING_FAIL))
                {
                    to_marker = Some(self.start.elapsed());
                }
                if !status.success() && to_marker.is_none() {
                    let mut err = String::new();
                    if let Some(mut e) = self.process.child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    bail!("qemu exited with {status} before the guest finished: {err}");
                }
                return Ok(VmRun {
                    ping_ok: console_text.contains(PING_OK),
                    console: console_text,
                    to_marker,
                    total: self.start.elapsed(),
                    tap_holders: Vec::new(),
                });
            }
            if self.start.elapsed() > BOOT_TIMEOUT {
                self.process.stop();
                bail!("the guest did not finish within {BOOT_TIMEOUT:?}; console:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Boots the guest with QEMU (TCG) in `pod_ns` as uid 107, its NIC on
/// `tap_node` opened read-write by that user as fd 3.
pub fn run_qemu(
    pod_ns: &str,
    tap_node: &Path,
    guest: &Guest,
    net: &GuestNet,
    work: &Path,
) -> Result<VmRun> {
    let mut holders = Vec::new();
    let mut run =
        Qemu::spawn(pod_ns, &Netdev::TapNode(tap_node), guest, net, "", work)?.wait(|_| {
            if !held_by_qemu(&holders) {
                holders = tap_holders(tap_node);
            }
        })?;
    run.tap_holders = holders;
    Ok(run)
}

/// What virt-launcher reads from the pod's link before it writes the domain.
#[derive(Debug, Clone)]
pub struct PodLink {
    /// The pod interface (e.g. `pod9d32cad27e2`).
    pub ifname: String,
    /// Its MAC.
    pub mac: String,
    /// Its MTU.
    pub mtu: u32,
    /// Its ifindex (the `N` of `/dev/tapN`).
    pub ifindex: u32,
}

impl PodLink {
    /// Reads `ifname` in the network namespace named `pod_ns`.
    pub fn read(pod_ns: &str, ifname: &str) -> Result<Self> {
        let out = crate::sandbox::ip(&["-n", pod_ns, "-j", "link", "show", "dev", ifname])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        Ok(PodLink {
            ifname: ifname.to_string(),
            mac: v[0]["address"]
                .as_str()
                .context("the pod link has no MAC")?
                .to_string(),
            mtu: v[0]["mtu"]
                .as_u64()
                .and_then(|m| u32::try_from(m).ok())
                .context("the pod link has no MTU")?,
            ifindex: v[0]["ifindex"]
                .as_u64()
                .and_then(|m| u32::try_from(m).ok())
                .context("the pod link has no ifindex")?,
        })
    }
}

/// The VM's side of one macvtap-bound interface.
#[derive(Debug, Clone)]
pub struct VmIface {
    /// The VM spec's `macAddress`, if it sets one.
    pub mac_address: Option<String>,
    /// Queues (and vCPUs): more than 1 is KubeVirt's
    /// `networkInterfaceMultiqueue`.
    pub queues: u32,
}

/// A libvirtd running inside a pod namespace as virt-launcher runs it
/// (unprivileged, uid 107, session mode, virt-launcher's `qemu.conf`);
/// stopped on drop.
pub struct Libvirtd {
    process: Reaped,
    dir: PathBuf,
    uri: String,
}

/// virt-launcher's `qemu.conf` (`cmd/virt-launcher/qemu.conf`), but for
/// `stdio_handler`, which is `logd` there (virtlogd is not run here).
const VIRT_LAUNCHER_QEMU_CONF: &str = "stdio_handler = \"file\"\nvnc_tls = 0\nvnc_sasl = 0\n\
user = \"qemu\"\ngroup = \"qemu\"\ndynamic_ownership = 1\nremember_owner = 0\n\
namespaces = [ ]\ncgroup_controllers = [ ]\n";

impl Libvirtd {
    /// Starts libvirtd in `pod_ns` as uid/gid 107 with its home, config,
    /// sockets and state under `dir` (given to that user); `/etc/passwd`
    /// and `/etc/group` carry virt-launcher's `qemu` user (107) in a mount
    /// namespace private to it.
    pub fn start(pod_ns: &str, dir: &Path) -> Result<Self> {
        let home = dir.join("home");
        let config = home.join("config/libvirt");
        let run = home.join("run");
        std::fs::create_dir_all(&config)?;
        std::fs::create_dir_all(&run)?;
        std::fs::create_dir_all(dir.join("log"))?;
        std::fs::write(config.join("qemu.conf"), VIRT_LAUNCHER_QEMU_CONF)?;
        let sock = run.join("libvirt");
        std::fs::write(
            config.join("libvirtd.conf"),
            format!(
                "unix_sock_dir = \"{}\"\nlog_outputs = \"3:file:{}/log/libvirtd.log\"\n",
                sock.display(),
                dir.display()
            ),
        )?;
        let mut passwd = std::fs::read_to_string("/etc/passwd")?;
        passwd.push_str(&format!(
            "qemu:x:{QEMU_UID}:{QEMU_UID}:qemu user:{}:/usr/sbin/nologin\n",
            home.display()
        ));
        let mut group = std::fs::read_to_string("/etc/group")?;
        group.push_str(&format!("qemu:x:{QEMU_UID}:\n"));
        std::fs::write(dir.join("passwd"), passwd)?;
        std::fs::write(dir.join("group"), group)?;
        if !Path::new("/usr/sbin/libvirtd").exists() {
            bail!(
                "libvirtd is missing: apt-get install libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients"
            );
        }
        let dir_str = dir.to_str().context("libvirtd's directory is not UTF-8")?;
        crate::sandbox::sh(&["chown", "-R", &format!("{QEMU_UID}:{QEMU_UID}"), dir_str])?;
        // `ip netns exec` gives the shell its own mount namespace.
        let script = format!(
            "set -e\nmount --bind {dir}/passwd /etc/passwd\nmount --bind {dir}/group /etc/group\n\
             exec {setpriv} env HOME={home} XDG_RUNTIME_DIR={run} XDG_CONFIG_HOME={home}/config \
             XDG_CACHE_HOME={home}/cache libvirtd -p {run}/libvirtd.pid -f {config}/libvirtd.conf\n",
            dir = dir.display(),
            home = home.display(),
            run = run.display(),
            config = config.display(),
            setpriv = as_qemu_user().join(" "),
        );
        let log = std::fs::File::create(dir.join("log/stdout"))?;
        let child = Command::new("ip")
            .args(["netns", "exec", pod_ns, "sh", "-c", &script])
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting libvirtd")?;
        let uri = format!(
            "qemu+unix:///session?socket={}/libvirt-sock",
            sock.display()
        );
        let mut me = Libvirtd {
            process: Reaped {
                child,
                what: "libvirtd".into(),
            },
            dir: dir.to_path_buf(),
            uri,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if sock.join("libvirt-sock").exists() && me.virsh(&["version"]).is_ok() {
                return Ok(me);
            }
            if let Some(status) = me.process.child.try_wait()? {
                let out = std::fs::read_to_string(me.dir.join("log/stdout")).unwrap_or_default();
                bail!("libvirtd exited with {status}: {out}");
            }
            if Instant::now() > deadline {
                bail!("libvirtd did not answer within 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The pid of libvirtd's process tree root (the `ip netns exec` child).
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Runs `virsh` against this daemon.
    pub fn virsh(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("virsh")
            .arg("-c")
            .arg(&self.uri)
            .args(args)
            .output()
            .context("running virsh (apt-get install libvirt-clients)")?;
        if !out.status.success() {
            bail!(
                "virsh {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The domain XML virt-launcher writes for a VM whose one NIC is bound
    /// to the macvtap `link` in the pod: an unmanaged ethernet interface,
    /// the VM's MAC or else the link's, the link's MTU, and with more than
    /// one queue as many vCPUs and `<driver queues>`.
    pub fn domain_xml(
        &self,
        name: &str,
        link: &PodLink,
        vm: &VmIface,
        guest_files: (&Path, &Path),
        cmdline: &str,
    ) -> String {
        let mac = vm.mac_address.as_deref().unwrap_or(&link.mac);
        let driver = if vm.queues > 1 {
            format!("\n      <driver queues='{}'/>", vm.queues)
        } else {
            String::new()
        };
        format!(
            r#"<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>{vcpus}</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel>
    <initrd>{initrd}</initrd>
    <cmdline>{cmdline}</cmdline>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <interface type='ethernet'>
      <target dev='{ifname}' managed='no'/>
      <mac address='{mac}'/>
      <model type='virtio'/>
      <mtu size='{mtu}'/>{driver}
      <rom enabled='no'/>
    </interface>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>
"#,
            vcpus = vm.queues.max(1),
            kernel = guest_files.0.display(),
            initrd = guest_files.1.display(),
            ifname = link.ifname,
            mtu = link.mtu,
            console = self.dir.join(format!("{name}.console")).display(),
        )
    }

    /// virt-launcher's part for one VM: reads the pod link, writes the
    /// domain ([`Libvirtd::domain_xml`]), creates it and waits until the
    /// guest powers off. Returns the run and the domain XML.
    pub fn run_vm(
        &self,
        name: &str,
        pod_ns: &str,
        ifname: &str,
        vm: &VmIface,
        guest: &Guest,
        net: &GuestNet,
    ) -> Result<(VmRun, String)> {
        let link = PodLink::read(pod_ns, ifname)?;
        // libvirt chowns what the domain uses (dynamic_ownership): give it
        // copies, not the shared cache.
        let kernel = self.dir.join("vmlinuz");
        let initrd = self.dir.join("initrd");
        std::fs::copy(&guest.kernel, &kernel)?;
        std::fs::copy(&guest.initrd, &initrd)?;
        for f in [&kernel, &initrd] {
            give_to_qemu(f)?;
        }
        let xml = self.domain_xml(name, &link, vm, (&kernel, &initrd), &net.cmdline());
        let console = self.dir.join(format!("{name}.console"));
        let _ = std::fs::remove_file(&console);
        let xml_path = self.dir.join(format!("{name}.xml"));
        std::fs::write(&xml_path, &xml)?;
        let tap = PathBuf::from(format!("/dev/tap{}", link.ifindex));
        let start = Instant::now();
        self.virsh(&["create", &xml_path.to_string_lossy()])?;
        let mut to_marker = None;
        let mut holders = Vec::new();
        let mut unanswered = 0;
        loop {
            if !held_by_qemu(&holders) {
                holders = tap_holders(&tap);
            }
            // Whether the domain is gone is asked *before* the console is
            // read: once it is gone, the read below is made after its end
            // and holds everything the guest printed.
            let gone = match self.domain_state(name) {
                Ok(state) => {
                    unanswered = 0;
                    state.ended()
                }
                Err(e) => {
                    // A transient failure (libvirtd busy) is not an end.
                    unanswered += 1;
                    if unanswered >= DOMSTATE_TRIES {
                        let _ = self.virsh(&["destroy", name]);
                        return Err(e.context(format!(
                            "virsh domstate failed {DOMSTATE_TRIES} times in a row"
                        )));
                    }
                    false
                }
            };
            let text = std::fs::read_to_string(&console).unwrap_or_default();
            if to_marker.is_none() && (text.contains(PING_OK) || text.contains(PING_FAIL)) {
                to_marker = Some(start.elapsed());
            }
            if gone {
                return Ok((
                    VmRun {
                        ping_ok: text.contains(PING_OK),
                        console: text,
                        to_marker,
                        total: start.elapsed(),
                        tap_holders: holders,
                    },
                    xml,
                ));
            }
            if start.elapsed() > BOOT_TIMEOUT {
                let _ = self.virsh(&["destroy", name]);
                bail!("domain {name} did not finish within {BOOT_TIMEOUT:?}; console:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// How many `virsh domstate` failures in a row (100 ms apart) end a wait.
const DOMSTATE_TRIES: u32 = 20;

/// A domain's state as `virsh domstate` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainState {
    /// libvirt knows no such domain (a transient domain that ended).
    Gone,
    /// The state libvirt reports, e.g. `running`, `shut off`.
    Is(String),
}

impl DomainState {
    /// The domain no longer runs: gone, shut off or crashed.
    pub fn ended(&self) -> bool {
        match self {
            DomainState::Gone => true,
            DomainState::Is(s) => s == "shut off" || s == "crashed",
        }
    }

    /// Reads `virsh domstate`'s outcome: its stdout, or the error it printed.
    /// Only "no such domain" means gone; any other error is an error.
    pub fn parse(outcome: std::result::Result<&str, &str>) -> Option<Self> {
        match outcome {
            Ok(out) => Some(DomainState::Is(out.trim().to_string())),
            Err(err)
                if err.contains("Domain not found") || err.contains("failed to get domain") =>
            {
                Some(DomainState::Gone)
            }
            Err(_) => None,
        }
    }
}

impl Libvirtd {
    /// The domain's state; an error only when virsh failed for another
    /// reason than an unknown domain.
    pub fn domain_state(&self, name: &str) -> Result<DomainState> {
        match self.virsh(&["domstate", name]) {
            Ok(out) => Ok(DomainState::Is(out.trim().to_string())),
            Err(e) => match DomainState::parse(Err(&format!("{e:#}"))) {
                Some(state) => Ok(state),
                None => Err(e),
            },
        }
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        self.process.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::DomainState;

    #[test]
    fn only_an_unknown_domain_counts_as_gone() {
        let gone = "virsh domstate vm: error: failed to get domain 'vm'";
        assert_eq!(DomainState::parse(Err(gone)), Some(DomainState::Gone));
        // A transient failure is no answer, not an end.
        let busy = "virsh: error: failed to connect to the hypervisor";
        assert_eq!(DomainState::parse(Err(busy)), None);
        let running = DomainState::parse(Ok("running\n")).unwrap();
        assert!(!running.ended());
        assert!(DomainState::parse(Ok("shut off\n")).unwrap().ended());
    }
}
