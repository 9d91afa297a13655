//! Crash injection: every operation's storage writes and flushes are recorded; for every
//! prefix of the log (and a torn version of the next write) the files are rebuilt, reopened
//! (or repaired), and compared with the model: acknowledged data is never lost, in-flight
//! bytes are either old or new, snapshots and base data never read as zeros.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use pcow::{AllocInit, Chain, Image, MemStorage, Op, Recorder, Storage};

const CS: u64 = 16384;
const SIZE: u64 = 12 * CS;

#[derive(Clone)]
struct State {
    view: Vec<u8>,
    snapshots: BTreeMap<String, Vec<u8>>,
}

struct Step {
    name: &'static str,
    start: usize,
    end: usize,
    before: State,
    after: State,
}

fn open_or_repair(storages: &[Arc<dyn Storage>]) -> Chain {
    match open_chain(storages) {
        Ok(c) => c,
        Err(first) => {
            let images: Vec<Image> = storages
                .iter()
                .map(|s| Image::open(s.clone(), true))
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("open failed ({first}) and files unreadable: {e}"));
            let mut c = Chain::from_images(images, true)
                .unwrap_or_else(|e| panic!("open failed ({first}); tolerant open failed: {e}"));
            c.repair()
                .unwrap_or_else(|e| panic!("open failed ({first}); repair failed: {e}"));
            drop(c);
            open_chain(storages).unwrap_or_else(|e| panic!("reopen after repair failed: {e}"))
        }
    }
}

fn verify(storages: &[Arc<dyn Storage>], before: &State, after: &State, what: &str) {
    let mut chain = open_or_repair(storages);
    let got = read_all(&chain);
    for (i, (&g, (&b, &a))) in got
        .iter()
        .zip(before.view.iter().zip(&after.view))
        .enumerate()
    {
        assert!(
            g == b || g == a,
            "{what}: byte {i} (cluster {}, unit {}) is {g}, expected old {b} or new {a}",
            i as u64 / CS,
            (i as u64 % CS) / 4096
        );
    }
    let names: Vec<String> = chain
        .snapshot_list()
        .into_iter()
        .map(|s| s.record.name)
        .collect();
    for n in &names {
        assert!(
            before.snapshots.contains_key(n) || after.snapshots.contains_key(n),
            "{what}: unexpected snapshot {n}"
        );
    }
    for n in before.snapshots.keys() {
        if after.snapshots.contains_key(n) {
            assert!(names.contains(n), "{what}: snapshot {n} lost");
        }
    }
    // The image stays usable: a new write lands and nothing else changes.
    let probe = pattern(201, 5000);
    chain.write(3 * CS + 100, &probe).unwrap();
    chain.flush().unwrap();
    let mut want = got.clone();
    want[(3 * CS + 100) as usize..(3 * CS + 100) as usize + 5000].copy_from_slice(&probe);
    drop(chain);
    let mut chain = open_chain(storages).unwrap();
    assert_same(
        &read_all(&chain),
        &want,
        &format!("{what}: write after recovery"),
    );
    // Snapshot contents are intact.
    for n in &names {
        let content = before
            .snapshots
            .get(n)
            .or_else(|| after.snapshots.get(n))
            .unwrap();
        chain.snapshot_apply(n).unwrap();
        assert_same(&read_all(&chain), content, &format!("{what}: snapshot {n}"));
    }
}

#[test]
fn every_crash_point_of_every_operation_recovers() {
    // Base with data everywhere, so that lost copy-on-write would read as base bytes or zeros.
    let base_mem = MemStorage::new("base");
    create_in(Arc::new(base_mem.clone()), CS, SIZE, None);
    let base_view = pattern(99, SIZE as usize);
    {
        let bs: Arc<dyn Storage> = Arc::new(base_mem.clone());
        let mut b = open_chain(&[bs]).unwrap();
        b.write(0, &base_view).unwrap();
        b.flush().unwrap();
    }
    let top_mem = MemStorage::new("top");
    {
        let bs: Arc<dyn Storage> = Arc::new(base_mem.clone());
        create_in(Arc::new(top_mem.clone()), CS, SIZE, Some(&bs));
    }
    let rec = Recorder::new();
    let top_rec = rec.wrap(0, top_mem);
    let base_rec = rec.wrap(1, base_mem);
    let storages: Vec<Arc<dyn Storage>> =
        vec![Arc::new(top_rec.clone()), Arc::new(base_rec.clone())];
    let mut chain = open_chain(&storages).unwrap();

    let mut state = State {
        view: base_view,
        snapshots: BTreeMap::new(),
    };
    let mut steps: Vec<Step> = Vec::new();
    let mut run = |name: &'static str,
                   chain: &mut Chain,
                   state: &mut State,
                   f: &mut dyn FnMut(&mut Chain, &mut State)| {
        let before = state.clone();
        let start = rec.op_count();
        f(chain, state);
        chain.flush().unwrap();
        steps.push(Step {
            name,
            start,
            end: rec.op_count(),
            before,
            after: state.clone(),
        });
    };
    let w = |off: u64, len: u64, seed: u8| {
        let len = len as usize;
        move |c: &mut Chain, s: &mut State| {
            let d = pattern(seed, len);
            c.write(off, &d).unwrap();
            s.view[off as usize..off as usize + len].copy_from_slice(&d);
        }
    };
    run(
        "partial write over base",
        &mut chain,
        &mut state,
        &mut w(CS + 1000, 9000, 1),
    );
    run(
        "write spanning clusters",
        &mut chain,
        &mut state,
        &mut w(5 * CS - 300, CS + 600, 2),
    );
    run("snapshot create s1", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_create("s1").unwrap();
        s.snapshots.insert("s1".into(), s.view.clone());
    });
    run(
        "copy-on-write after snapshot",
        &mut chain,
        &mut state,
        &mut w(CS + 5000, 100, 3),
    );
    run(
        "discard cluster held below",
        &mut chain,
        &mut state,
        &mut |c, s| {
            c.discard(2 * CS, CS).unwrap();
            s.view[(2 * CS) as usize..(3 * CS) as usize].fill(0);
        },
    );
    run(
        "mapping-service copy-on-write",
        &mut chain,
        &mut state,
        &mut |c, s| {
            let a = c.allocate(7, AllocInit::Empty).unwrap();
            let unit = pattern(4, 4096);
            c.images()[0]
                .storage()
                .write_at(&unit, a.file_offset + 4096)
                .unwrap();
            c.images()[0].storage().flush().unwrap();
            c.mark_valid(7, &[0b10]).unwrap();
            s.view[(7 * CS + 4096) as usize..(7 * CS + 8192) as usize].copy_from_slice(&unit);
        },
    );
    run("discard cluster 8", &mut chain, &mut state, &mut |c, s| {
        c.discard(8 * CS, CS).unwrap();
        s.view[(8 * CS) as usize..(9 * CS) as usize].fill(0);
    });
    run(
        "mapping-service expansion",
        &mut chain,
        &mut state,
        &mut |c, s| {
            let a = c.allocate(8, AllocInit::Zeroed).unwrap();
            let d = pattern(5, 100);
            c.images()[0]
                .storage()
                .write_at(&d, a.file_offset + 10)
                .unwrap();
            s.view[(8 * CS + 10) as usize..(8 * CS + 110) as usize].copy_from_slice(&d);
        },
    );
    run("snapshot create s2", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_create("s2").unwrap();
        s.snapshots.insert("s2".into(), s.view.clone());
    });
    run(
        "write after s2",
        &mut chain,
        &mut state,
        &mut w(0, 3 * CS, 6),
    );
    run("snapshot apply s1", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_apply("s1").unwrap();
        s.view = s.snapshots["s1"].clone();
    });
    run(
        "write after apply",
        &mut chain,
        &mut state,
        &mut w(6 * CS + 7, 20000, 7),
    );
    run("snapshot delete s1", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_delete("s1").unwrap();
        s.snapshots.remove("s1");
    });
    run("snapshot delete s2", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_delete("s2").unwrap();
        s.snapshots.remove("s2");
    });
    run("compact", &mut chain, &mut state, &mut |c, _| {
        c.compact(|_, _| {}).unwrap();
    });
    run("snapshot create s3", &mut chain, &mut state, &mut |c, s| {
        c.snapshot_create("s3").unwrap();
        s.snapshots.insert("s3".into(), s.view.clone());
    });
    run(
        "write after s3",
        &mut chain,
        &mut state,
        &mut w(9 * CS, 2 * CS, 8),
    );
    run(
        "snapshot delete s3 (merge into writable)",
        &mut chain,
        &mut state,
        &mut |c, s| {
            c.snapshot_delete("s3").unwrap();
            s.snapshots.remove("s3");
        },
    );
    run("commit into base", &mut chain, &mut state, &mut |c, _| {
        c.commit(|_, _| {}).unwrap();
    });
    run(
        "write after commit",
        &mut chain,
        &mut state,
        &mut w(4 * CS, 4096, 9),
    );
    run(
        "rebase onto nothing",
        &mut chain,
        &mut state,
        &mut |c, _| {
            c.rebase(None, false, |_, _| {}).unwrap();
        },
    );
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
    let mut checked = 0;
    for step in &steps {
        for k in step.start..=step.end {
            let storages_k = |torn: Option<usize>| -> Vec<Arc<dyn Storage>> {
                vec![
                    Arc::new(top_rec.replay(k, torn)) as Arc<dyn Storage>,
                    Arc::new(base_rec.replay(k, torn)),
                ]
            };
            let what = format!(
                "{} crash after op {k} of {}..{}",
                step.name, step.start, step.end
            );
            let storages = storages_k(None);
            verify_flexible(&storages, step, &what);
            checked += 1;
            if let Some((_, Op::Write { data, .. })) = ops.get(k) {
                if k < step.end && data.len() > 8 {
                    let torn = storages_k(Some((data.len() / 2) & !7));
                    verify_flexible(&torn, step, &format!("{what} + torn write"));
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 200, "only {checked} crash points were checked");
}

/// The rebase step removes the backing file from the header; a crash image may or may not
/// name it, so the chain is opened with as many files as the header asks for.
fn verify_flexible(storages: &[Arc<dyn Storage>], step: &Step, what: &str) {
    let top = Image::open(storages[0].clone(), false);
    let needs_base = top
        .map(|i| !i.header().backing_name.is_empty())
        .unwrap_or(true);
    let files = if needs_base { storages } else { &storages[..1] };
    verify(files, &step.before, &step.after, what);
}
