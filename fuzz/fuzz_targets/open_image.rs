//! Fuzzes the pcow metadata parser (`pcow::fuzz::open_image`): any byte string opened as a
//! pcow image must give an error or a working image — never a panic or a hang — through
//! open, check, reads and repair.
//! Corpus: `fuzz/corpus/open_image`; `cargo test -p pcow` replays it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    pcow::fuzz::open_image(data);
});
