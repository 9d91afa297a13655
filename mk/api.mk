# The per-VM API (crates/api): HTTP/1.1 + JSON on a unix socket. Its route table, HTTP
# reader and socket tests run in `cargo test`, which also replays the fuzz corpus.
#   make fuzz-api   cargo-fuzz run of the HTTP request reader + route table (target
#                   api_request in fuzz/, corpus fuzz/corpus/api_request; mk/fuzz.mk)
