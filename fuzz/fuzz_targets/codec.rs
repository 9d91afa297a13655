//! Fuzzes the 9P codec and the server core (`densevm_9p::fuzz::codec`): any byte string
//! handed to a session must produce exactly one well-formed response frame, and any frame
//! that decodes must re-encode to the same bytes.
//! Corpus: `fuzz/corpus/codec`; `cargo test -p densevm-9p` replays it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &[u8]| {
    densevm_9p::fuzz::codec(raw);
});
