//! Minimal standalone server for experiments: `serve DIR unix:PATH|tcp:HOST:PORT [WORKERS]`.
//! (The supported front end is `densevm 9p serve`.)

use densevm_9p::{Config, DriverOptions, ListenAddr, Listener, Server};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: serve DIR unix:PATH|tcp:HOST:PORT [WORKERS]".into());
    }
    let workers = args.get(3).map(|w| w.parse()).transpose()?.unwrap_or(8);
    densevm_9p::sys::raise_nofile_limit();
    let server = Server::new(std::path::Path::new(&args[1]), Config::default())?;
    let listener = Listener::bind(&args[2].parse::<ListenAddr>()?)?;
    listener.serve(
        &server,
        DriverOptions {
            workers,
            ..DriverOptions::default()
        },
        None,
    )?;
    Ok(())
}
