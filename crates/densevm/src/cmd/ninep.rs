//! `densevm 9p`: serve a host directory over 9P2000.L.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use densevm_9p::{Config, DriverOptions, IdMap, ListenAddr, Listener, Server};

// Arguments of `densevm 9p`.
#[derive(Args, Debug)]
pub struct NinePArgs {
    #[command(subcommand)]
    command: NinePCommand,
}

#[derive(Subcommand, Debug)]
enum NinePCommand {
    /// Export DIR over 9P2000.L until interrupted.
    Serve(ServeArgs),
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Directory to export (the jail root).
    dir: PathBuf,
    /// Where to listen: unix:PATH or tcp:HOST:PORT (e.g. tcp:127.0.0.1:5640).
    #[arg(long)]
    listen: String,
    /// Refuse every modifying request (EROFS).
    #[arg(long)]
    readonly: bool,
    /// Map guest uids to host uids: GUEST:HOST[:COUNT] (repeatable). Unmapped ids become 65534.
    #[arg(long = "uid-map", value_name = "GUEST:HOST[:COUNT]")]
    uid_map: Vec<String>,
    /// Map guest gids to host gids: GUEST:HOST[:COUNT] (repeatable).
    #[arg(long = "gid-map", value_name = "GUEST:HOST[:COUNT]")]
    gid_map: Vec<String>,
    /// Largest message size offered to clients, in bytes.
    #[arg(long, default_value_t = densevm_9p::server::DEFAULT_MAX_MSIZE)]
    msize: u32,
    /// Worker threads per connection.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// Exit after serving this many connections (default: serve forever).
    #[arg(long)]
    max_conns: Option<usize>,
}

/// Runs the subcommand; returns the process exit code.
pub fn main(args: NinePArgs) -> anyhow::Result<i32> {
    match args.command {
        NinePCommand::Serve(a) => serve(a),
    }
}

fn parse_map(specs: &[String], what: &str) -> anyhow::Result<IdMap> {
    let mut map = IdMap::identity();
    for s in specs {
        map.add(s)
            .with_context(|| format!("bad --{what}-map; use GUEST:HOST[:COUNT], e.g. 0:1000:1"))?;
    }
    Ok(map)
}

fn serve(a: ServeArgs) -> anyhow::Result<i32> {
    let addr: ListenAddr = a
        .listen
        .parse()
        .context("fix --listen, e.g. --listen unix:/tmp/9p.sock")?;
    let cfg = Config {
        readonly: a.readonly,
        uid_map: parse_map(&a.uid_map, "uid")?,
        gid_map: parse_map(&a.gid_map, "gid")?,
        max_msize: a.msize,
        ..Config::default()
    };
    let nofile = densevm_9p::sys::raise_nofile_limit();
    let server = Server::new(&a.dir, cfg).context("check that DIR exists and is a directory")?;
    let listener = Listener::bind(&addr).context("pick a free address or remove the old socket")?;
    eprintln!(
        "densevm 9p: serving {} on {} ({}; fd limit {nofile})",
        a.dir.display(),
        a.listen,
        if a.readonly {
            "read-only"
        } else {
            "read-write"
        }
    );
    let opts = DriverOptions {
        workers: a.workers.max(1),
        ..DriverOptions::default()
    };
    listener
        .serve(&server, opts, a.max_conns)
        .context("accepting 9p connections failed")?;
    Ok(0)
}
