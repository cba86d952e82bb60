//! Commands the connection's shard answers itself, with no queue and no owner (`Runs::Connection`
//! in `Command::facts`): PING and RSLV (the names role is off: simplexmq `Server.hs` answers
//! `ERR NAME NO_RESOLVER` without a resolver). SUBS and NSUBS run on the connection too, but never
//! come here: `conn/dispatch.rs` (`service_subs`) refuses them with `ERR SERVICE` outside a service
//! session or without its signature, and hands the others to `conn/services.rs`.

use crate::protocol::command::Command;
use crate::protocol::error::{ErrorType, NameError};
use crate::protocol::response::BrokerMsg;

/// The answer to a command the connection answers itself.
pub fn answer(cmd: &Command) -> BrokerMsg {
    match cmd {
        Command::Ping => BrokerMsg::Pong,
        Command::Rslv(_) => BrokerMsg::Err(ErrorType::Name(NameError::NoResolver)),
        // No other command runs on the connection with an answer of its own (`Command::facts`).
        _ => BrokerMsg::Err(ErrorType::Internal),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_and_rslv_are_answered_here() {
        assert_eq!(answer(&Command::Ping), BrokerMsg::Pong);
        assert_eq!(
            answer(&Command::Rslv("simplex.im".into())),
            BrokerMsg::Err(ErrorType::Name(NameError::NoResolver))
        );
    }
}
