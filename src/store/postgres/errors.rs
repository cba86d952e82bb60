//! PostgreSQL errors as text, for logs and `ERR STORE`.

/// A database error with its message, not just "db error"; any other error with its causes
/// (a failed TLS handshake says why only in its source, e.g. "certificate verify failed").
pub fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} ({})", d.message(), d.code().code()),
        None => {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                let t = c.to_string();
                if !t.is_empty() && !text.contains(&t) {
                    text.push_str(": ");
                    text.push_str(&t);
                }
                cause = c.source();
            }
            text
        }
    }
}
