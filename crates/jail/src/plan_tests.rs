use super::*;

fn flags(jail: Option<&str>, uid: Option<u32>, gid: Option<u32>) -> JailFlags {
    JailFlags {
        jail: jail.map(PathBuf::from),
        uid,
        gid,
        ..Default::default()
    }
}

fn spec() -> JailSpec {
    flags(Some("/srv/jail/vm1"), Some(64100), Some(64100))
        .validate(false, 42)
        .unwrap()
        .unwrap()
}

fn err(r: Result<impl std::fmt::Debug>) -> String {
    r.unwrap_err().to_string()
}

#[test]
fn no_jail_no_flags_is_none() {
    assert_eq!(JailFlags::default().validate(true, 1).unwrap(), None);
}

#[test]
fn uid_gid_netns_list_need_jail() {
    for (f, name) in [
        (flags(None, Some(5), None), "--uid"),
        (flags(None, None, Some(5)), "--gid"),
        (
            JailFlags {
                netns: Some("host".into()),
                ..Default::default()
            },
            "--netns",
        ),
        (
            JailFlags {
                list: true,
                ..Default::default()
            },
            "--jail-list",
        ),
        (
            JailFlags {
                id: Some("a".into()),
                ..Default::default()
            },
            "--jail-id",
        ),
    ] {
        let e = err(f.validate(false, 1));
        assert!(e.starts_with(name) && e.contains("add --jail DIR"), "{e}");
    }
}

#[test]
fn jail_dir_must_be_absolute_normal_and_not_root() {
    for dir in ["jail", "/srv/../jail", "/"] {
        let e = err(flags(Some(dir), Some(5), Some(5)).validate(false, 1));
        assert!(e.starts_with("--jail"), "{dir}: {e}");
    }
}

#[test]
fn jail_needs_uid_and_gid_and_refuses_root() {
    let e = err(flags(Some("/j"), Some(5), None).validate(false, 1));
    assert!(e.contains("needs --uid N and --gid N"), "{e}");
    let e = err(flags(Some("/j"), Some(0), Some(5)).validate(false, 1));
    assert!(e.contains("would keep root"), "{e}");
    let e = err(flags(Some("/j"), Some(5), Some(0)).validate(false, 1));
    assert!(e.contains("would keep root"), "{e}");
}

#[test]
fn id_defaults_to_pid_and_is_checked() {
    assert_eq!(spec().id, "42");
    let mut f = flags(Some("/j"), Some(5), Some(5));
    f.id = Some("../x".into());
    assert!(err(f.validate(false, 1)).contains("--jail-id"));
    f.id = Some("vm-1.a_b".into());
    assert_eq!(f.validate(false, 1).unwrap().unwrap().id, "vm-1.a_b");
}

#[test]
fn netns_defaults() {
    let f = flags(Some("/j"), Some(5), Some(5));
    assert_eq!(f.validate(false, 1).unwrap().unwrap().netns, Netns::New);
    assert_eq!(f.validate(true, 1).unwrap().unwrap().netns, Netns::Host);
    let mut g = f.clone();
    g.netns = Some("/run/netns/a".into());
    assert_eq!(
        g.validate(true, 1).unwrap().unwrap().netns,
        Netns::Join("/run/netns/a".into())
    );
    g.netns = Some("new".into());
    assert!(err(g.validate(true, 1)).contains("has no taps"));
    g.netns = Some("relative".into());
    assert!(err(g.validate(false, 1)).contains("--netns relative"));
}

#[test]
fn binds_are_sorted_merged_and_deduplicated() {
    let plan = PlanBuilder::new(spec())
        .file("/img/b.pcow", false, "disk 0")
        .file("/img/base.pcow", true, "disk 0 base")
        .file("/img/b.pcow", true, "pmem 0")
        .dir("/share", true, "share a")
        .file("/share/inner", true, "covered, same access")
        .file("/share/rw", false, "covered, more access")
        .parent_dir(Path::new("/run/vm/api.sock"), "api socket")
        .build()
        .unwrap();
    let got: Vec<(&str, bool)> = plan
        .binds
        .iter()
        .map(|b| (b.path.to_str().unwrap(), b.readonly))
        .collect();
    assert_eq!(
        got,
        [
            ("/img/b.pcow", false),
            ("/img/base.pcow", true),
            ("/run/vm", false),
            ("/share", true),
            ("/share/rw", false)
        ]
    );
    assert_eq!(plan.binds[0].why, "disk 0; pmem 0");
    assert_eq!(
        plan.devices,
        [Device::Kvm, Device::Userfaultfd, Device::Null]
    );
}

#[test]
fn bad_bind_paths_are_refused() {
    for (path, what) in [
        ("rel/x", "absolute"),
        ("/srv/jail/vm1/disk", "inside the jail directory"),
        ("/srv", "contains the jail directory"),
        ("/", "whole host"),
    ] {
        let e = err(PlanBuilder::new(spec()).dir(path, true, "x").build());
        assert!(e.contains(what), "{path}: {e}");
    }
    let e = err(PlanBuilder::new(spec())
        .file("/a", true, "disk")
        .dir("/a", true, "share")
        .build());
    assert!(e.contains("both as a file and as a directory"), "{e}");
}

#[test]
fn listing_has_every_ancestor_device_proc_and_tap() {
    let plan = PlanBuilder::new(spec())
        .file("/img/k/vmlinux", true, "kernel")
        .dir("/share", false, "share")
        .file("/share/sub/x", true, "inside")
        .tap("tap0")
        .build()
        .unwrap();
    let paths: Vec<String> = plan
        .listing()
        .iter()
        .map(|e| format!("{} {}", e.path.display(), e.kind))
        .collect();
    assert_eq!(
        paths,
        [
            "/dev dir",
            "/dev/kvm device",
            "/dev/net dir",
            "/dev/net/tun device",
            "/dev/null device",
            "/dev/userfaultfd device",
            "/img dir",
            "/img/k dir",
            "/img/k/vmlinux file",
            "/proc proc",
            "/share tree",
            "/share/sub/x file",
            "/sys dir",
            "/sys/class dir",
            "/sys/class/net dir",
            "/sys/class/net/tap0 sysfs",
        ]
    );
    let json = plan.to_json();
    assert_eq!(json["uid"], 64100);
    assert_eq!(json["entries"].as_array().unwrap().len(), 16);
}

#[test]
fn userfaultfd_can_be_left_out() {
    let plan = PlanBuilder::new(spec()).userfaultfd(false).build().unwrap();
    assert_eq!(plan.devices, [Device::Kvm, Device::Null]);
}
