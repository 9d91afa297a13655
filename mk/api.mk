# The per-VM API (crates/api): HTTP/1.1 + JSON on a unix socket. Its route table, HTTP
# reader and socket tests run in `cargo test`, which also replays the fuzz seeds.
#   make fuzz-api   bounded cargo-fuzz run of the HTTP request reader + route table from
#                   crates/api/fuzz/corpus/api_request (needs cargo-fuzz; installed if
#                   missing); new inputs go to crates/api/fuzz/found (not committed)
API_FUZZ_SECONDS ?= 60

.PHONY: fuzz-api

# cargo-fuzz needs nightly flags; RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
fuzz-api:
	@command -v cargo-fuzz >/dev/null || { echo "fuzz-api: installing cargo-fuzz"; $(CARGO) install cargo-fuzz --locked; }
	mkdir -p crates/api/fuzz/found/api_request
	cd crates/api/fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run api_request found/api_request corpus/api_request \
	  -- -max_total_time=$(API_FUZZ_SECONDS) -max_len=16384 -rss_limit_mb=2048
