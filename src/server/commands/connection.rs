//! Commands the connection's shard answers itself, with no queue and no owner (`Runs::Connection`
//! in `Command::facts`): PING, RSLV (the names role is off: simplexmq `Server.hs` answers
//! `ERR NAME NO_RESOLVER` without a resolver), and SUBS/NSUBS outside a service session, which are
//! `ERR SERVICE` (a service session's go to `conn.rs`, `subscribe_service`).

use crate::protocol::command::Command;
use crate::protocol::error::{ErrorType, NameError};
use crate::protocol::response::BrokerMsg;

/// The answer to a command the connection answers itself.
pub fn answer(cmd: &Command) -> BrokerMsg {
    match cmd {
        Command::Ping => BrokerMsg::Pong,
        Command::Rslv(_) => BrokerMsg::Err(ErrorType::Name(NameError::NoResolver)),
        _ => BrokerMsg::Err(ErrorType::Service),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_rslv_and_service_commands_are_answered_here() {
        assert_eq!(answer(&Command::Ping), BrokerMsg::Pong);
        assert_eq!(
            answer(&Command::Rslv("simplex.im".into())),
            BrokerMsg::Err(ErrorType::Name(NameError::NoResolver))
        );
    }
}
