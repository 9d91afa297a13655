//! Shared helpers for human and `--json` output.

use serde::Serialize;

/// Prints `value` as pretty JSON on stdout.
pub fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// `err` and its causes, each said once: "context: cause: cause". Many error types print
/// their source in their own message too (so that `{}` alone is complete), which anyhow's
/// `{:#}` would then repeat; a cause whose text the message already holds is left out.
pub fn error_chain(err: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if text.is_empty() || msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read kernel {path}: {source}")]
    struct ReadError {
        path: String,
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let err = anyhow::Error::new(ReadError {
            path: "/x".into(),
            source: io,
        })
        .context("could not start the VM");
        assert_eq!(
            error_chain(&err),
            "could not start the VM: cannot read kernel /x: No such file or directory (os error 2)"
        );
        // Causes that do not repeat themselves are all kept, in order.
        let err = anyhow::anyhow!("inner").context("middle").context("outer");
        assert_eq!(error_chain(&err), "outer: middle: inner");
    }
}
