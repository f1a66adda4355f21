//! SIGTERM and SIGINT for the examples: a clean stop instead of a crash, so leases and
//! leaderships are handed over at once rather than lapsing after the TTL.

use std::sync::{Arc, Weak};

use botmesh::Bot;

/// On the first SIGTERM or SIGINT, stops `bot` cleanly (if it is still alive: the
/// handle is weak, so it never keeps the bot from being dropped), runs `then`, and
/// exits the process with status 0. Runs on a thread of its own.
///
/// # Errors
/// The signal handler could not be installed.
pub fn stop_on_signal(bot: &Arc<Bot>, then: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
    let bot: Weak<Bot> = Arc::downgrade(bot);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                eprintln!("signal {sig}: stopping cleanly");
                if let Some(bot) = bot.upgrade()
                    && let Err(e) = bot.stop()
                {
                    eprintln!("{e}");
                }
                then();
                std::process::exit(0);
            }
        })?;
    Ok(())
}
