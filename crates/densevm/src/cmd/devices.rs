//! `densevm run`'s device options: `--disk`, `--share`, `--rng`, `--net`, `--vsock`, parsed and
//! checked before the VM is built, so a bad option never starts a guest.

use anyhow::{bail, Context};
use densevm_9p::IdMap;
use densevm_api::NetworkOverride;
use densevm_virtio::block::{Block, BlockConfig, ImageFormat};
use densevm_virtio::net::tap::Tap;
use densevm_virtio::net::Net;
use densevm_virtio::p9::{ShareConfig, P9};
use densevm_virtio::rng::Rng;
use densevm_virtio::vsock::{Vsock, VsockConfig};
use densevm_virtio::VirtioDevice;
use std::collections::HashSet;
use std::path::PathBuf;

/// `--disk PATH[,readonly][,format=raw|pcow]`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskSpec {
    /// Image file.
    pub path: PathBuf,
    /// The guest may not write.
    pub readonly: bool,
    /// Image format: explicit, or pcow for a `.pcow` name and raw otherwise (never probed
    /// from the contents: a guest could write a pcow header into a raw disk).
    pub pcow: bool,
}

/// `--share HOSTDIR,tag=TAG[,readonly][,uid-map=G:H[:N]][,gid-map=G:H[:N]]`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShareSpec {
    /// Host directory exported.
    pub dir: PathBuf,
    /// The mount tag the guest names.
    pub tag: String,
    /// Refuse writes.
    pub readonly: bool,
    /// Guest-to-host uid mappings.
    pub uid_map: Vec<String>,
    /// Guest-to-host gid mappings.
    pub gid_map: Vec<String>,
}

/// `--net tap=NAME[,mac=MAC]`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetSpec {
    /// The tap interface (it must exist).
    pub tap: String,
    /// The guest's MAC address (`aa:bb:cc:dd:ee:ff`); a random locally administered one
    /// when not given, fixed in the specs so that a restore keeps it.
    pub mac: Option<String>,
}

/// Parses `--net-override IFACE=TAP` (`net0=tap-c{index}` for clones).
pub fn parse_net_override(spec: &str) -> anyhow::Result<NetworkOverride> {
    let Some((iface, tap)) = spec.split_once('=') else {
        anyhow::bail!("--net-override {spec}: give IFACE=TAP, e.g. net0=tap1");
    };
    if iface_index(iface).is_none() || tap.is_empty() {
        anyhow::bail!(
            "--net-override {spec}: give IFACE=TAP with IFACE net0 for the VM's first --net, \
             net1 for the second, ..."
        );
    }
    Ok(NetworkOverride {
        iface_id: iface.to_owned(),
        host_dev_name: tap.to_owned(),
    })
}

fn iface_index(iface: &str) -> Option<usize> {
    iface.strip_prefix("net")?.parse().ok()
}

/// Puts the network interfaces of a VM being restored on other taps; `index` is the
/// clone's (it replaces `{index}` in tap names).
pub fn override_nets(
    nets: &mut [NetSpec],
    overrides: &[NetworkOverride],
    index: Option<u32>,
) -> anyhow::Result<()> {
    for o in overrides {
        let Some(n) = iface_index(&o.iface_id).and_then(|i| nets.get_mut(i)) else {
            anyhow::bail!(
                "network override {}: the VM has {} network interface(s) (net0..net{})",
                o.iface_id,
                nets.len(),
                nets.len().saturating_sub(1)
            );
        };
        n.tap = match index {
            Some(k) => o.for_clone(k),
            None => o.host_dev_name.clone(),
        };
    }
    Ok(())
}

/// Checks that clones of a VM with `nets` get a tap of their own for each interface.
pub fn check_clone_nets(nets: &[NetSpec], overrides: &[NetworkOverride]) -> Result<(), String> {
    let mut probe = nets.to_vec();
    override_nets(&mut probe, overrides, Some(0)).map_err(|e| e.to_string())?;
    for (i, n) in nets.iter().enumerate() {
        if !overrides
            .iter()
            .any(|o| iface_index(&o.iface_id) == Some(i))
        {
            return Err(format!(
                "the VM's net{i} is on tap {}, and a tap serves one VM: give each clone its own \
                 with a network override (net{i}=tap-c{{index}}: API network_overrides, or \
                 --net-override), the taps made beforehand",
                n.tap
            ));
        }
    }
    Ok(())
}

/// Parses one `--net` value.
pub fn parse_net(spec: &str) -> anyhow::Result<NetSpec> {
    let mut n = NetSpec {
        tap: String::new(),
        mac: None,
    };
    for o in spec.split(',').filter(|o| !o.is_empty()) {
        match o.split_once('=') {
            Some(("tap", t)) => n.tap = t.to_string(),
            Some(("mac", m)) => {
                let mac = densevm_virtio::net::parse_mac(m)
                    .map_err(|e| anyhow::anyhow!("--net {spec}: {e}"))?;
                n.mac = Some(densevm_virtio::net::format_mac(&mac));
            }
            _ => bail!("--net {spec}: unknown option '{o}' (options: tap=NAME, mac=MAC)"),
        }
    }
    if n.tap.is_empty() {
        bail!(
            "--net {spec}: name the tap, e.g. --net tap=tap0 (create it with `ip tuntap add tap0 mode tap`)"
        );
    }
    Ok(n)
}

/// The longest mount tag Linux's 9p virtio transport accepts.
pub const MAX_TAG_LEN: usize = 255;

/// Splits `PATH,opt,opt=value`: the path is everything up to the first comma.
fn split(spec: &str) -> (&str, Vec<&str>) {
    let mut parts = spec.split(',');
    let path = parts.next().unwrap_or("");
    (path, parts.filter(|p| !p.is_empty()).collect())
}

/// Parses one `--disk` value.
pub fn parse_disk(spec: &str) -> anyhow::Result<DiskSpec> {
    let (path, opts) = split(spec);
    if path.is_empty() {
        bail!("--disk needs a file: --disk PATH[,readonly][,format=raw|pcow]");
    }
    let mut d = DiskSpec {
        path: PathBuf::from(path),
        readonly: false,
        pcow: path.ends_with(".pcow"),
    };
    for o in opts {
        match o {
            "readonly" | "ro" => d.readonly = true,
            "format=raw" => d.pcow = false,
            "format=pcow" => d.pcow = true,
            _ => bail!("--disk {spec}: unknown option '{o}' (options: readonly, format=raw|pcow)"),
        }
    }
    Ok(d)
}

/// Parses one `--share` value.
pub fn parse_share(spec: &str) -> anyhow::Result<ShareSpec> {
    let (dir, opts) = split(spec);
    if dir.is_empty() {
        bail!("--share needs a host directory: --share HOSTDIR,tag=TAG[,readonly]");
    }
    let mut s = ShareSpec {
        dir: PathBuf::from(dir),
        tag: String::new(),
        readonly: false,
        uid_map: Vec::new(),
        gid_map: Vec::new(),
    };
    for o in opts {
        match o.split_once('=') {
            Some(("tag", t)) => s.tag = t.to_string(),
            Some(("uid-map", m)) => s.uid_map.push(m.to_string()),
            Some(("gid-map", m)) => s.gid_map.push(m.to_string()),
            None if o == "readonly" || o == "ro" => s.readonly = true,
            _ => bail!(
                "--share {spec}: unknown option '{o}' (options: tag=TAG, readonly, uid-map=G:H[:N], gid-map=G:H[:N])"
            ),
        }
    }
    if s.tag.is_empty() {
        bail!("--share {spec}: give the mount tag the guest uses, e.g. --share {dir},tag=host0");
    }
    if s.tag.len() > MAX_TAG_LEN || s.tag.bytes().any(|b| b == 0 || b.is_ascii_whitespace()) {
        bail!("--share {spec}: the tag must be 1..={MAX_TAG_LEN} bytes without spaces");
    }
    Ok(s)
}

/// Parses `--vsock cid=N,uds=PATH`.
pub fn parse_vsock(spec: &str) -> anyhow::Result<VsockConfig> {
    let mut cid = None;
    let mut uds = None;
    for o in spec.split(',').filter(|o| !o.is_empty()) {
        match o.split_once('=') {
            Some(("cid", n)) => {
                let n: u64 = n.parse().map_err(|_| {
                    anyhow::anyhow!("--vsock {spec}: cid must be a number, e.g. cid=3")
                })?;
                cid = Some(n);
            }
            Some(("uds", p)) if !p.is_empty() => uds = Some(PathBuf::from(p)),
            _ => bail!("--vsock {spec}: unknown option '{o}' (give cid=N,uds=PATH)"),
        }
    }
    let (Some(guest_cid), Some(uds)) = (cid, uds) else {
        bail!("--vsock {spec}: give both the guest's CID and the host socket, e.g. --vsock cid=3,uds=/tmp/vm.vsock");
    };
    if !(densevm_virtio::vsock::MIN_GUEST_CID..=densevm_virtio::vsock::MAX_GUEST_CID)
        .contains(&guest_cid)
    {
        bail!(
            "--vsock {spec}: cid {guest_cid} is reserved or too large; use 3 <= cid < 4294967295"
        );
    }
    Ok(VsockConfig { guest_cid, uds })
}

/// Checks what can be checked across options: no two shares with one tag, no disk given
/// twice (two devices writing one file would corrupt it).
pub fn check_unique(
    disks: &[DiskSpec],
    shares: &[ShareSpec],
    nets: &[NetSpec],
) -> anyhow::Result<()> {
    let mut taps = HashSet::new();
    for n in nets {
        if !taps.insert(&n.tap) {
            bail!(
                "two --net options use tap '{}'; a tap serves one network device, give each its own",
                n.tap
            );
        }
    }
    let mut macs = HashSet::new();
    for m in nets.iter().filter_map(|n| n.mac.as_ref()) {
        if !macs.insert(m) {
            bail!("two --net options use MAC address {m}; give each its own");
        }
    }
    let mut tags = HashSet::new();
    for s in shares {
        if !tags.insert(&s.tag) {
            bail!(
                "two --share options use tag '{}'; give each share its own tag",
                s.tag
            );
        }
    }
    let mut files = HashSet::new();
    for d in disks {
        // A disk that cannot be resolved is reported by its device, which says what to do.
        let Ok(key) = std::fs::canonicalize(&d.path) else {
            continue;
        };
        if !files.insert(key) {
            bail!(
                "--disk {} is given twice; a file can back only one disk",
                d.path.display()
            );
        }
    }
    Ok(())
}

/// Checks the options together and opens every device, so that a missing file, a
/// directory given as a disk or a duplicate tag stops densevm before the VM exists.
/// Opened devices, with a storage handle for each disk (in `--disk` order).
pub type OpenDevices = (
    Vec<Box<dyn VirtioDevice>>,
    Vec<densevm_virtio::block::BackendHandle>,
);

/// The virtio devices of a VM as the command line gave them, saved in its snapshots so a
/// restore opens the same ones in the same order (absolute paths).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceSpecs {
    /// `--disk`, in order.
    pub disks: Vec<DiskSpec>,
    /// `--share`, in order.
    pub shares: Vec<ShareSpec>,
    /// `--rng`.
    pub rng: bool,
    /// `--pmem` images (mapped by the caller, not opened as virtio devices here).
    #[serde(default)]
    pub pmem: Vec<PathBuf>,
    /// `--vsock`.
    #[serde(default)]
    pub vsock: Option<VsockConfig>,
    /// `--net`, in order, each with its MAC address.
    #[serde(default)]
    pub nets: Vec<NetSpec>,
}

impl DeviceSpecs {
    /// The specs with every path made absolute and every `--net` given a MAC address.
    pub fn absolute(
        disks: &[DiskSpec],
        shares: &[ShareSpec],
        rng: bool,
        pmem: &[PathBuf],
        nets: &[NetSpec],
    ) -> Self {
        let abs = |p: &PathBuf| std::path::absolute(p).unwrap_or_else(|_| p.clone());
        DeviceSpecs {
            disks: disks
                .iter()
                .map(|d| DiskSpec {
                    path: abs(&d.path),
                    ..d.clone()
                })
                .collect(),
            shares: shares
                .iter()
                .map(|s| ShareSpec {
                    dir: abs(&s.dir),
                    ..s.clone()
                })
                .collect(),
            rng,
            pmem: pmem.iter().map(abs).collect(),
            vsock: None,
            nets: nets
                .iter()
                .map(|n| NetSpec {
                    tap: n.tap.clone(),
                    mac: Some(n.mac.clone().unwrap_or_else(|| {
                        densevm_virtio::net::format_mac(&densevm_virtio::net::random_mac())
                    })),
                })
                .collect(),
        }
    }

    /// With `--vsock` (its socket path made absolute).
    pub fn with_vsock(mut self, vsock: Option<&VsockConfig>) -> Self {
        self.vsock = vsock.map(|v| VsockConfig {
            uds: std::path::absolute(&v.uds).unwrap_or_else(|_| v.uds.clone()),
            ..v.clone()
        });
        self
    }

    /// Opens the devices, with a storage handle for each disk (in `disks` order).
    pub fn open(&self) -> anyhow::Result<OpenDevices> {
        // Order matters (a restore recreates the devices in the same PCI slots): disks,
        // shares, rng, nets, then vsock.
        let (mut devices, handles) = open_devices(&self.disks, &self.shares, self.rng, &self.nets)?;
        if let Some(v) = &self.vsock {
            let dev = Vsock::open(v.clone())
                .with_context(|| format!("--vsock uds={}", v.uds.display()))?;
            devices.push(Box::new(dev));
        }
        Ok((devices, handles))
    }
}

pub fn open_devices(
    disks: &[DiskSpec],
    shares: &[ShareSpec],
    rng: bool,
    nets: &[NetSpec],
) -> anyhow::Result<OpenDevices> {
    check_unique(disks, shares, nets)?;
    let mut devices: Vec<Box<dyn VirtioDevice>> = Vec::new();
    let mut handles = Vec::new();
    for d in disks {
        let cfg = BlockConfig {
            path: d.path.clone(),
            readonly: d.readonly,
            format: if d.pcow {
                ImageFormat::Pcow
            } else {
                ImageFormat::Raw
            },
        };
        let block = Block::open(cfg).with_context(|| format!("--disk {}", d.path.display()))?;
        handles.push(block.backend_handle());
        devices.push(Box::new(block));
    }
    for s in shares {
        let mut cfg = ShareConfig::new(&s.dir, &s.tag);
        cfg.server.readonly = s.readonly;
        cfg.server.uid_map = parse_map(&s.uid_map, "uid")?;
        cfg.server.gid_map = parse_map(&s.gid_map, "gid")?;
        let share = P9::new(cfg).with_context(|| format!("--share {}", s.dir.display()))?;
        devices.push(Box::new(share));
    }
    if rng {
        devices.push(Box::new(Rng::new()));
    }
    for n in nets {
        let mac = match &n.mac {
            Some(m) => densevm_virtio::net::parse_mac(m)
                .map_err(|e| anyhow::anyhow!("--net tap={}: {e}", n.tap))?,
            None => densevm_virtio::net::random_mac(),
        };
        let tap = Tap::open(&n.tap).with_context(|| format!("--net tap={}", n.tap))?;
        devices.push(Box::new(Net::new(tap, mac)));
    }
    Ok((devices, handles))
}

fn parse_map(specs: &[String], what: &str) -> anyhow::Result<IdMap> {
    let mut map = IdMap::identity();
    for s in specs {
        map.add(s).with_context(|| {
            format!("bad {what}-map in --share; use GUEST:HOST[:COUNT], e.g. 0:1000:1")
        })?;
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_specs() {
        let d = parse_disk("/tmp/a.img,readonly").unwrap();
        assert_eq!((d.readonly, d.pcow), (true, false));
        assert!(parse_disk("/tmp/a.pcow").unwrap().pcow);
        assert!(!parse_disk("/tmp/a.pcow,format=raw").unwrap().pcow);
        assert!(parse_disk("/tmp/a.img,format=pcow").unwrap().pcow);
        let e = parse_disk("/tmp/a.img,format=qcow2")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown option 'format=qcow2'"), "{e}");
        assert!(parse_disk("").is_err());
    }

    #[test]
    fn share_specs() {
        let s = parse_share("/srv,tag=host0,readonly,uid-map=0:1000:1").unwrap();
        assert_eq!(s.tag, "host0");
        assert!(s.readonly);
        assert_eq!(s.uid_map, ["0:1000:1"]);
        let e = parse_share("/srv").unwrap_err().to_string();
        assert!(e.contains("tag=host0"), "{e}");
        assert!(parse_share("/srv,tag=a b").is_err());
        assert!(parse_share("/srv,tag=x,bogus").is_err());
        let a = parse_share("/a,tag=t").unwrap();
        let b = parse_share("/b,tag=t").unwrap();
        let e = check_unique(&[], &[a, b], &[]).unwrap_err().to_string();
        assert!(e.contains("tag 't'"), "{e}");
    }

    #[test]
    fn vsock_specs() {
        let v = parse_vsock("cid=3,uds=/tmp/v.sock").unwrap();
        assert_eq!((v.guest_cid, v.uds.to_str()), (3, Some("/tmp/v.sock")));
        for (bad, want) in [
            ("cid=2,uds=/tmp/v", "reserved"),
            ("cid=4294967295,uds=/tmp/v", "reserved"),
            ("cid=x,uds=/tmp/v", "must be a number"),
            ("cid=3", "give both"),
            ("uds=/tmp/v", "give both"),
            ("cid=3,uds=/tmp/v,port=1", "unknown option"),
        ] {
            let e = parse_vsock(bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn vsock_socket_problems_are_reported_at_open() {
        let dir = std::env::temp_dir().join(format!("densevm-vsock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let uds = dir.join("v.sock");
        std::fs::write(&uds, b"").unwrap();
        let specs = DeviceSpecs::default().with_vsock(Some(&VsockConfig {
            guest_cid: 3,
            uds: uds.clone(),
        }));
        let e = format!("{:#}", specs.open().err().unwrap());
        assert!(e.contains("--vsock uds=") && e.contains("remove it"), "{e}");
        std::fs::remove_file(&uds).unwrap();
        let (devices, _) = specs.open().unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].device_type(), densevm_virtio::device_type::VSOCK);
        // Old snapshots have no vsock field.
        let old: DeviceSpecs =
            serde_json::from_str(r#"{"disks":[],"shares":[],"rng":false}"#).unwrap();
        assert!(old.vsock.is_none());
        drop(devices);
        assert!(!uds.exists(), "the socket goes with the device");
        std::fs::remove_dir(&dir).unwrap();
    }

    #[test]
    fn the_same_disk_twice_is_refused() {
        let f = std::env::temp_dir().join(format!("densevm-disk-{}", std::process::id()));
        std::fs::write(&f, [0u8; 512]).unwrap();
        let d = parse_disk(f.to_str().unwrap()).unwrap();
        let e = check_unique(&[d.clone(), d], &[], &[])
            .unwrap_err()
            .to_string();
        assert!(e.contains("given twice"), "{e}");
        std::fs::remove_file(&f).unwrap();
        // Missing files are left to the device, whose error says how to create one.
        assert!(check_unique(&[parse_disk("/nonexistent/x").unwrap()], &[], &[]).is_ok());
    }

    #[test]
    fn net_overrides_put_interfaces_on_other_taps() {
        let nets = vec![
            NetSpec {
                tap: "tap0".into(),
                mac: Some("06:00:00:00:00:01".into()),
            },
            NetSpec {
                tap: "tap1".into(),
                mac: None,
            },
        ];
        let o = parse_net_override("net1=tap-c{index}").unwrap();
        let mut restored = nets.clone();
        override_nets(
            &mut restored,
            &[parse_net_override("net0=other").unwrap()],
            None,
        )
        .unwrap();
        assert_eq!(
            (restored[0].tap.as_str(), restored[1].tap.as_str()),
            ("other", "tap1")
        );
        assert_eq!(restored[0].mac, nets[0].mac, "the guest keeps its MAC");
        let mut clone = nets.clone();
        override_nets(&mut clone, std::slice::from_ref(&o), Some(3)).unwrap();
        assert_eq!(clone[1].tap, "tap-c3");
        for bad in ["net0", "eth0=tap", "net=tap", "net0="] {
            assert!(parse_net_override(bad).is_err(), "{bad}");
        }
        let e = override_nets(&mut clone, &[parse_net_override("net2=x").unwrap()], None);
        assert!(e.unwrap_err().to_string().contains("2 network interface"));
        // Clones need a tap of their own for every interface.
        let e = check_clone_nets(&nets, std::slice::from_ref(&o)).unwrap_err();
        assert!(e.contains("net0 is on tap tap0"), "{e}");
        let both = [parse_net_override("net0=a{index}").unwrap(), o];
        check_clone_nets(&nets, &both).unwrap();
        check_clone_nets(&[], &[]).unwrap();
    }

    #[test]
    fn net_specs() {
        let n = parse_net("tap=tap0,mac=06:00:AC:10:00:02").unwrap();
        assert_eq!(n.tap, "tap0");
        assert_eq!(n.mac.as_deref(), Some("06:00:ac:10:00:02"));
        assert_eq!(parse_net("tap=t1").unwrap().mac, None);
        let e = parse_net("mac=06:00:00:00:00:01").unwrap_err().to_string();
        assert!(e.contains("ip tuntap add"), "{e}");
        let e = parse_net("tap=t,mac=zz").unwrap_err().to_string();
        assert!(e.contains("six hex bytes"), "{e}");
        let e = parse_net("tap=t,mac=01:00:00:00:00:01")
            .unwrap_err()
            .to_string();
        assert!(e.contains("multicast"), "{e}");
        assert!(parse_net("tap=t,bogus").is_err());
        let e = check_unique(
            &[],
            &[],
            &[parse_net("tap=a").unwrap(), parse_net("tap=a").unwrap()],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("tap 'a'"), "{e}");
        let a = parse_net("tap=a,mac=06:00:00:00:00:01").unwrap();
        let b = parse_net("tap=b,mac=06:00:00:00:00:01").unwrap();
        assert!(check_unique(&[], &[], &[a, b]).is_err());
    }

    #[test]
    fn a_missing_tap_is_a_clear_error_and_specs_keep_a_mac() {
        let n = parse_net("tap=dvmnotap0").unwrap();
        let specs = DeviceSpecs::absolute(&[], &[], false, &[], &[n]);
        let mac = specs.nets[0].mac.clone().expect("a MAC is chosen");
        densevm_virtio::net::parse_mac(&mac).unwrap();
        let e = format!("{:#}", specs.open().err().expect("no such tap"));
        assert!(e.contains("--net tap=dvmnotap0"), "{e}");
        assert!(e.contains("ip tuntap add dvmnotap0 mode tap"), "{e}");
        // Old snapshots have no nets.
        let old: DeviceSpecs =
            serde_json::from_str(r#"{"disks":[],"shares":[],"rng":false}"#).unwrap();
        assert!(old.nets.is_empty());
    }
}
