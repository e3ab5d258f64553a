//! Running the guest on a macvtap inside a pod namespace, the two ways
//! virt-launcher's stack does it: QEMU given an open `/dev/tapN` as fd 3, and
//! libvirtd (inside the pod namespace) with an unmanaged ethernet interface.

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
    /// Starts QEMU (TCG) in `pod_ns` with the guest NIC on `netdev` and
    /// `extra` appended to the kernel command line.
    pub fn spawn(
        pod_ns: &str,
        netdev: &Netdev,
        guest: &Guest,
        net: &GuestNet,
        extra: &str,
        work: &Path,
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
        let start = Instant::now();
        let child = Command::new("ip")
            .args([
                "netns",
                "exec",
                pod_ns,
                "sh",
                "-c",
                r#"exec "$@" 3<>"$TAP""#,
                "sh",
            ])
            .arg("qemu-system-x86_64")
            .args([
                "-accel", "tcg", "-m", "256", "-smp", "1", "-display", "none", "-monitor", "none",
            ])
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
                let console_text = self.console_text();
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

/// Boots the guest with QEMU (TCG) in `pod_ns`, its NIC on `tap_node`
/// opened read-write as fd 3, as virt-launcher hands QEMU a tap fd.
pub fn run_qemu(
    pod_ns: &str,
    tap_node: &Path,
    guest: &Guest,
    net: &GuestNet,
    work: &Path,
) -> Result<VmRun> {
    Qemu::spawn(pod_ns, &Netdev::TapNode(tap_node), guest, net, "", work)?.wait(|_| {})
}

/// A libvirtd running inside a pod namespace with private state, as
/// virt-launcher runs it; stopped on drop.
pub struct Libvirtd {
    process: Reaped,
    dir: PathBuf,
    uri: String,
    created: Vec<PathBuf>,
}

const LIBVIRT_STATE_DIRS: [&str; 4] = [
    "/run/libvirt",
    "/var/lib/libvirt",
    "/var/cache/libvirt",
    "/var/log/libvirt",
];

impl Libvirtd {
    /// Starts libvirtd in `pod_ns` with its config, sockets and state under
    /// `dir` (tmpfs and bind mounts private to its mount namespace).
    pub fn start(pod_ns: &str, dir: &Path) -> Result<Self> {
        let etc = dir.join("etc");
        let sock = dir.join("sock");
        std::fs::create_dir_all(&etc)?;
        std::fs::create_dir_all(&sock)?;
        std::fs::create_dir_all(dir.join("log"))?;
        std::fs::write(
            etc.join("libvirtd.conf"),
            format!(
                "unix_sock_dir = \"{}\"\nunix_sock_rw_perms = \"0700\"\nauth_unix_ro = \"none\"\n\
                 auth_unix_rw = \"none\"\nlog_outputs = \"3:file:{}/log/libvirtd.log\"\n",
                sock.display(),
                dir.display()
            ),
        )?;
        // Without libvirt-daemon-system: qemu runs as root, no cgroups, no
        // private /dev, no security driver, no virtlogd.
        std::fs::write(
            etc.join("qemu.conf"),
            "user = \"root\"\ngroup = \"root\"\ndynamic_ownership = 0\nremember_owner = 0\n\
             security_driver = \"none\"\ncgroup_controllers = [ ]\nnamespaces = [ ]\n\
             stdio_handler = \"file\"\n",
        )?;
        // libvirt resolves its default user before reading qemu.conf.
        let mut passwd = std::fs::read_to_string("/etc/passwd")?;
        if !passwd.contains("\nlibvirt-qemu:") {
            passwd.push_str("libvirt-qemu:x:64055:64055::/var/lib/libvirt:/usr/sbin/nologin\n");
        }
        let mut group = std::fs::read_to_string("/etc/group")?;
        if !group.contains("\nlibvirt-qemu:") {
            group.push_str("libvirt-qemu:x:64055:\n");
        }
        std::fs::write(dir.join("passwd"), passwd)?;
        std::fs::write(dir.join("group"), group)?;
        let mut created = Vec::new();
        for d in LIBVIRT_STATE_DIRS {
            let p = PathBuf::from(d);
            if !p.exists() {
                std::fs::create_dir_all(&p)?;
                created.push(p);
            }
        }
        if !Path::new("/etc/libvirt").exists() {
            bail!(
                "/etc/libvirt is missing: apt-get install libvirt-daemon libvirt-daemon-driver-qemu libvirt-clients"
            );
        }
        let script = format!(
            "set -e\nfor d in {dirs}; do mount -t tmpfs tmpfs $d; done\n\
             mount --bind {etc} /etc/libvirt\nmount --bind {dir}/passwd /etc/passwd\n\
             mount --bind {dir}/group /etc/group\n\
             exec libvirtd -p {dir}/libvirtd.pid -f {etc}/libvirtd.conf\n",
            dirs = LIBVIRT_STATE_DIRS.join(" "),
            etc = etc.display(),
            dir = dir.display()
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
        let uri = format!("qemu:///system?socket={}/libvirt-sock", sock.display());
        let mut me = Libvirtd {
            process: Reaped {
                child,
                what: "libvirtd".into(),
            },
            dir: dir.to_path_buf(),
            uri,
            created,
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

    /// The pid of libvirtd.
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
                "virsh {args:?}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Creates a transient domain whose NIC is the unmanaged ethernet
    /// interface `ifname` (what KubeVirt's macvtap binding produces) and
    /// waits until the guest powers off.
    pub fn run_domain(
        &self,
        name: &str,
        ifname: &str,
        guest: &Guest,
        net: &GuestNet,
    ) -> Result<VmRun> {
        let console = self.dir.join(format!("{name}.console"));
        let _ = std::fs::remove_file(&console);
        let xml = format!(
            r#"<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
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
      <rom enabled='no'/>
    </interface>
    <serial type='file'><source path='{console}'/><target port='0'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>
"#,
            kernel = guest.kernel.display(),
            initrd = guest.initrd.display(),
            cmdline = net.cmdline(),
            mac = net.mac,
            console = console.display(),
        );
        let xml_path = self.dir.join(format!("{name}.xml"));
        std::fs::write(&xml_path, xml)?;
        let start = Instant::now();
        self.virsh(&["create", &xml_path.to_string_lossy()])?;
        let mut to_marker = None;
        loop {
            let text = std::fs::read_to_string(&console).unwrap_or_default();
            if to_marker.is_none() && (text.contains(PING_OK) || text.contains(PING_FAIL)) {
                to_marker = Some(start.elapsed());
            }
            if self.virsh(&["domstate", name]).is_err() {
                return Ok(VmRun {
                    ping_ok: text.contains(PING_OK),
                    console: text,
                    to_marker,
                    total: start.elapsed(),
                });
            }
            if start.elapsed() > BOOT_TIMEOUT {
                let _ = self.virsh(&["destroy", name]);
                bail!("domain {name} did not finish within {BOOT_TIMEOUT:?}; console:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Libvirtd {
    fn drop(&mut self) {
        self.process.stop();
        for d in self.created.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
    }
}
