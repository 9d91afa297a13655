//! Fuzzes what an API client can send: the input is a byte stream read by the HTTP request
//! reader (in reads of varying size), and every request it frames goes through the route
//! table and out as a response (`densevm_api::fuzz::api_request`). No input may panic.
//! Corpus: `fuzz/corpus/api_request` (plain HTTP); `cargo test -p densevm-api`
//! replays them, and random and mutated inputs, through the same entry point.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    densevm_api::fuzz::api_request(data);
});
