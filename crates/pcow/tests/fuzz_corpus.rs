//! The `open_image` fuzz target's corpus (`fuzz/corpus/open_image`), then seeded mutations
//! of it (bytes flipped in the header and metadata, cuts), through its entry point.

use std::path::Path;

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn corpus_and_mutations_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/open_image");
    let mut corpus = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/open_image") {
        corpus.push(std::fs::read(entry.unwrap().path()).unwrap());
    }
    assert!(!corpus.is_empty(), "no inputs in {}", dir.display());
    for c in &corpus {
        pcow::fuzz::open_image(c);
    }
    let mut x = 0x51_7cc1_b727_220au64;
    for i in 0..400 {
        let mut v = corpus[i % corpus.len()].clone();
        for _ in 0..1 + next(&mut x) % 8 {
            if v.is_empty() {
                break;
            }
            // Mostly the first 4 KiB: the header and the tables it points at.
            let span = if next(&mut x) % 4 == 0 {
                v.len()
            } else {
                v.len().min(4096)
            };
            let at = (next(&mut x) as usize) % span;
            match next(&mut x) % 8 {
                0 => v.truncate(at),
                _ => v[at] ^= 1 << (next(&mut x) % 8),
            }
        }
        pcow::fuzz::open_image(&v);
    }
}
