//! Crash injection: every operation's storage writes and flushes are recorded; for every
//! prefix of the log (and a torn version of the next write) the files are rebuilt, reopened
//! (or repaired), and compared with the model: acknowledged data is never lost, in-flight
//! bytes are either old or new, snapshots and base data never read as zeros.

mod common;

use common::harness::*;
use common::*;
use pcow::{AllocInit, Op};

const SIZE: u64 = 12 * CS;

#[test]
fn every_crash_point_of_every_operation_recovers() {
    // Base with data everywhere, so that lost copy-on-write would read as base bytes or zeros.
    let base_view = pattern(99, SIZE as usize);
    let mut fx = Fixture::new(SIZE, base_view);
    fx.run("partial write over base", &mut write_op(CS + 1000, 9000, 1));
    fx.run(
        "write spanning clusters",
        &mut write_op(5 * CS - 300, CS + 600, 2),
    );
    fx.run("snapshot create s1", &mut |c, s| {
        c.snapshot_create("s1").unwrap();
        s.snapshots.insert("s1".into(), s.view.clone());
    });
    fx.run(
        "copy-on-write after snapshot",
        &mut write_op(CS + 5000, 100, 3),
    );
    fx.run("discard cluster held below", &mut |c, s| {
        c.discard(2 * CS, CS).unwrap();
        s.view[(2 * CS) as usize..(3 * CS) as usize].fill(0);
    });
    fx.run("mapping-service copy-on-write", &mut |c, s| {
        let a = c.allocate(7, AllocInit::Empty).unwrap();
        let unit = pattern(4, 4096);
        c.images()[0]
            .storage()
            .write_at(&unit, a.file_offset + 4096)
            .unwrap();
        c.images()[0].storage().flush().unwrap();
        c.mark_valid(7, &[0b10]).unwrap();
        s.view[(7 * CS + 4096) as usize..(7 * CS + 8192) as usize].copy_from_slice(&unit);
    });
    fx.run("discard cluster 8", &mut |c, s| {
        c.discard(8 * CS, CS).unwrap();
        s.view[(8 * CS) as usize..(9 * CS) as usize].fill(0);
    });
    fx.run("mapping-service expansion", &mut |c, s| {
        let a = c.allocate(8, AllocInit::Zeroed).unwrap();
        let d = pattern(5, 100);
        c.images()[0]
            .storage()
            .write_at(&d, a.file_offset + 10)
            .unwrap();
        s.view[(8 * CS + 10) as usize..(8 * CS + 110) as usize].copy_from_slice(&d);
    });
    fx.run("snapshot create s2", &mut |c, s| {
        c.snapshot_create("s2").unwrap();
        s.snapshots.insert("s2".into(), s.view.clone());
    });
    fx.run("write after s2", &mut write_op(0, 3 * CS, 6));
    fx.run("snapshot apply s1", &mut |c, s| {
        c.snapshot_apply("s1").unwrap();
        s.view = s.snapshots["s1"].clone();
    });
    fx.run("write after apply", &mut write_op(6 * CS + 7, 20000, 7));
    fx.run("snapshot delete s1", &mut |c, s| {
        c.snapshot_delete("s1").unwrap();
        s.snapshots.remove("s1");
    });
    fx.run("snapshot delete s2", &mut |c, s| {
        c.snapshot_delete("s2").unwrap();
        s.snapshots.remove("s2");
    });
    fx.run("compact", &mut |c, _| {
        c.compact(|_, _| {}).unwrap();
    });
    fx.run("snapshot create s3", &mut |c, s| {
        c.snapshot_create("s3").unwrap();
        s.snapshots.insert("s3".into(), s.view.clone());
    });
    fx.run("write after s3", &mut write_op(9 * CS, 2 * CS, 8));
    fx.run("snapshot delete s3 (merge into writable)", &mut |c, s| {
        c.snapshot_delete("s3").unwrap();
        s.snapshots.remove("s3");
    });
    fx.run("commit into base", &mut |c, _| {
        c.commit(|_, _| {}).unwrap();
    });
    fx.run("write after commit", &mut write_op(4 * CS, 4096, 9));
    fx.run("rebase onto nothing", &mut |c, _| {
        c.rebase(None, false, |_, _| {}).unwrap();
    });
    let Fixture {
        rec,
        top_rec,
        base_rec,
        chain,
        steps,
        ..
    } = fx;
    drop(chain);

    let ops = rec.ops();
    if let Ok(k) = std::env::var("PCOW_DEBUG_K") {
        let k: usize = k.parse().unwrap();
        for (i, (id, op)) in ops
            .iter()
            .enumerate()
            .take(k + 3)
            .skip(k.saturating_sub(12))
        {
            let d = match op {
                Op::Write { offset, data } => format!("write {offset} len {}", data.len()),
                o => format!("{o:?}"),
            };
            eprintln!("op {i}: file {id} {d}");
        }
    }
    let checked = check_steps(&steps, &ops, &top_rec, &base_rec);
    assert!(checked > 200, "only {checked} crash points were checked");
}
