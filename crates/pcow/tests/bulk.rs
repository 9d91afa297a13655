//! The bulk raw import (`pcow::bulk`, used by `densevm image convert -f raw`): the image reads
//! back as the source for several cluster sizes (segments crossed, holes, zero clusters, a
//! partial last cluster), checks clean, and a crash at any point of its write log (plus a
//! torn version of the next write) leaves storage that either does not open as an image or
//! is the complete image.

mod common;

use std::io::Write;
use std::sync::Arc;

use common::*;
use pcow::{bulk, new_header, Chain, CreateOptions, Image, MemStorage, Op, Recorder, Storage};

/// A source file: data, a hole, written zeros, data across a segment boundary, a partial end.
fn source(dir: &std::path::Path, cs: u64) -> (std::path::PathBuf, Vec<u8>) {
    let size = 150 * cs + 1234;
    let mut want = vec![0u8; size as usize];
    for (i, cl) in want.chunks_mut(cs as usize).enumerate() {
        if i % 3 != 1 && !(40..60).contains(&i) {
            cl.copy_from_slice(&pattern(i as u8, cl.len()));
        }
    }
    // One non-zero byte at the very end of an otherwise zero cluster.
    want[(10 * cs + cs - 1) as usize] = 9;
    let path = dir.join(format!("src-{cs}.raw"));
    let mut f = std::fs::File::create(&path).unwrap();
    // Clusters 40..60 stay a hole (never written).
    f.write_all(&want[..(40 * cs) as usize]).unwrap();
    f.set_len(size).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(&want[(60 * cs) as usize..], 60 * cs)
        .unwrap();
    (path, want)
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("pcow-bulk-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn import_reads_back_as_the_source_and_checks_clean() {
    let dir = tempdir("roundtrip");
    for cs in [4096u64, 16384, 65536] {
        let (src, want) = source(&dir, cs);
        let dst = dir.join(format!("out-{cs}.pcow"));
        let stats = bulk::import_raw(&src, &dst, cs, |_, _| {}).unwrap();
        assert_eq!(stats.virtual_size, want.len() as u64);
        let chain = Chain::open(&dst, Default::default()).unwrap();
        assert_same(&read_all(&chain), &want, &format!("cluster size {cs}"));
        let report = chain.check();
        assert_eq!(report.exit_code(), 0, "{report:?}");
        let nonzero = want
            .chunks(cs as usize)
            .filter(|c| c.iter().any(|&b| b != 0))
            .count() as u64;
        assert_eq!(stats.data_clusters, nonzero);
        // An existing destination is never replaced, and no temporary file is left.
        assert!(bulk::import_raw(&src, &dst, cs, |_, _| {}).is_err());
        assert!(!bulk::temp_path(&dst).exists());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_crash_point_of_an_import_is_rejected_or_complete() {
    let dir = tempdir("crash");
    let cs = 4096u64;
    let (src, want) = source(&dir, cs);
    let input = std::fs::File::open(&src).unwrap();
    let header = new_header(
        &CreateOptions {
            virtual_size: want.len() as u64,
            cluster_size: cs,
            backing: None,
        },
        [0; 16],
    )
    .unwrap();
    let rec = Recorder::new();
    let out = rec.wrap(0, MemStorage::new("import"));
    bulk::import_into(
        &input,
        &src,
        want.len() as u64,
        &out,
        &header,
        &mut |_, _| {},
    )
    .unwrap();
    let ops = rec.ops();
    let (mut rejected, mut complete) = (0, 0);
    for k in 0..=ops.len() {
        let mut cases = vec![out.replay(k, None)];
        if let Some((_, Op::Write { data, .. })) = ops.get(k) {
            if data.len() > 8 {
                cases.push(out.replay(k, Some((data.len() / 2) & !7)));
            }
        }
        for m in cases {
            let st: Arc<dyn Storage> = Arc::new(m);
            match Image::open(st.clone(), false) {
                Err(_) => rejected += 1,
                Ok(img) => {
                    let chain = Chain::from_images(vec![img], false).unwrap();
                    assert_same(&read_all(&chain), &want, &format!("crash after op {k}"));
                    // Clean, or (header write torn) one stale header slot: leaks only.
                    let code = chain.check().exit_code();
                    assert!(code == 0 || code == 3, "crash after op {k}: check {code}");
                    complete += 1;
                }
            }
        }
    }
    assert!(
        rejected > 10 && complete >= 1,
        "{rejected} rejected, {complete} complete"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
