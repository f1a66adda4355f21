//! Duplicate suppression of one chat, bounded whatever the chat's traffic: the same
//! rules as the Redis backend (see the `redis` module docs). A claim is exact while
//! its message is in flight; a chat keeps its newest `dedup_ids` to 1.5 × `dedup_ids`
//! handled ids for the window, and for numeric ids that rise a floor (the highest id evicted),
//! under which an unknown id is a duplicate while the evicted marks' window runs. An id
//! under the highest one claimed that this chat never saw shows that its ids do not
//! rise, and turns the floor off for good.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::coordinator::Ticket;

type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

enum IdState {
    /// In flight: the claimant ticket has not been handled.
    Claimed {
        by: Ticket,
        expires: Instant,
    },
    Handled {
        expires: Instant,
    },
    /// Its ticket gave up (timed out, cancelled): a redelivery runs, and no floor
    /// covers it.
    GivenUp {
        expires: Instant,
    },
}

impl IdState {
    fn expires(&self) -> Instant {
        match self {
            IdState::Claimed { expires, .. }
            | IdState::Handled { expires }
            | IdState::GivenUp { expires } => *expires,
        }
    }
}

enum Floor {
    None,
    /// Ids up to `id` were evicted; the newest of those marks expires at `expires`.
    At {
        id: u64,
        expires: Instant,
    },
    /// The chat's ids do not rise.
    Off,
}

/// What [`Dedup::claim`] decided.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Handled within the window.
    Duplicate,
    /// Claimed by another ticket that is still alive.
    InFlight,
    /// Claimed by this ticket now.
    Claimed,
}

/// One chat's duplicate-suppression state.
pub(crate) struct Dedup {
    /// Claims and marks by message id.
    ids: HashMap<Arc<str>, IdState>,
    /// Handled ids, oldest first, for eviction (an id may be listed twice if it was
    /// handled again after its window). They share the string of their key in `ids`:
    /// one copy of an id per message, made by its claim.
    handled: VecDeque<Arc<str>>,
    floor: Floor,
    /// The highest numeric id claimed.
    hi: Option<u64>,
    /// The latest expiry of anything kept: the chat's entry stays until then.
    pub(crate) until: Instant,
}

/// A numeric id as the Redis backend reads one: no leading zero, at most 15 digits.
fn numeric(id: &str) -> Option<u64> {
    let digits = id.len() <= 15 && id.bytes().all(|b| b.is_ascii_digit());
    if !digits || id.starts_with('0') {
        return None;
    }
    id.parse().ok()
}

impl Dedup {
    pub(crate) fn new(now: Instant) -> Dedup {
        Dedup {
            ids: HashMap::default(),
            handled: VecDeque::new(),
            floor: Floor::None,
            hi: None,
            until: now,
        }
    }

    /// Claims `id` for `ticket` for `claim_for` (the dedup window, or the message's
    /// wait and a lease when longer: a claim must not lapse under a waiting message),
    /// unless it was handled within the window or a live ticket (by `alive`) holds it
    /// unhandled.
    pub(crate) fn claim(
        &mut self,
        now: Instant,
        claim_for: Duration,
        id: &str,
        ticket: &Ticket,
        alive: impl Fn(&Ticket) -> bool,
    ) -> Claim {
        let fresh = match self.ids.get(id) {
            Some(IdState::Handled { expires }) if *expires >= now => return Claim::Duplicate,
            Some(IdState::Claimed { by, expires })
                if *expires >= now && by != ticket && alive(by) =>
            {
                return Claim::InFlight;
            }
            Some(_) => false,
            None => true,
        };
        if let Floor::At { expires, .. } = self.floor
            && expires < now
        {
            self.floor = Floor::None;
        }
        if fresh
            && let Some(x) = numeric(id)
            && !matches!(self.floor, Floor::Off)
        {
            if let Floor::At { id: f, .. } = self.floor
                && x <= f
            {
                return Claim::Duplicate;
            }
            if self.hi.is_some_and(|hi| x < hi) {
                self.floor = Floor::Off;
            } else {
                self.hi = Some(x);
            }
        }
        let expires = now + claim_for;
        self.until = self.until.max(expires);
        let by = ticket.clone();
        match self.ids.get_mut(id) {
            Some(state) => *state = IdState::Claimed { by, expires },
            None => {
                self.ids.insert(id.into(), IdState::Claimed { by, expires });
            }
        }
        Claim::Claimed
    }

    /// `ticket` handled `id`: its claim becomes a handled mark for the window. Once
    /// the chat holds 1.5 × `keep` handled marks, the oldest go, down to `keep`.
    pub(crate) fn handled(
        &mut self,
        now: Instant,
        window: Duration,
        keep: usize,
        id: &str,
        ticket: &Ticket,
    ) {
        let Some((key, state)) = self.ids.get_key_value(id) else {
            return;
        };
        if !matches!(state, IdState::Claimed { by, .. } if by == ticket) {
            return;
        }
        // A second lookup, which is cheaper than a second copy of the id.
        let key = key.clone();
        let expires = now + window;
        if let Some(state) = self.ids.get_mut(id) {
            *state = IdState::Handled { expires };
        }
        self.until = self.until.max(expires);
        self.handled.push_back(key);
        if self.handled.len() >= keep + (keep / 2).max(1) {
            self.evict(now, keep);
        }
    }

    /// `ticket` gave `id` up: a redelivery of it may run.
    pub(crate) fn give_up(&mut self, id: &str, ticket: &Ticket) {
        if let Some(state) = self.ids.get_mut(id)
            && let IdState::Claimed { by, expires } = state
            && by == ticket
        {
            *state = IdState::GivenUp { expires: *expires };
        }
    }

    fn evict(&mut self, now: Instant, keep: usize) {
        while self.handled.len() > keep {
            let Some(id) = self.handled.pop_front() else {
                break;
            };
            let expires = match self.ids.get(&*id) {
                Some(IdState::Handled { expires }) => *expires,
                _ => continue,
            };
            self.ids.remove(&*id);
            if let Some(x) = numeric(&id) {
                self.floor = match self.floor {
                    Floor::Off => Floor::Off,
                    Floor::None => Floor::At { id: x, expires },
                    Floor::At { id: f, expires: e } => Floor::At {
                        id: f.max(x),
                        expires: e.max(expires),
                    },
                };
            }
        }
        // Claims and give-ups whose window passed go too.
        self.ids.retain(|_, s| s.expires() >= now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn t(seq: u64) -> Ticket {
        Ticket {
            replica: Arc::from("r"),
            seq,
        }
    }

    const W: Duration = Duration::from_secs(600);

    #[test]
    fn rising_ids_are_bounded_and_suppressed_by_the_floor() {
        let now = Instant::now();
        let mut d = Dedup::new(now);
        for i in 1..=200u64 {
            let id = i.to_string();
            assert_eq!(d.claim(now, W, &id, &t(i), |_| true), Claim::Claimed);
            d.handled(now, W, 16, &id, &t(i));
        }
        assert!(d.ids.len() <= 24, "{}", d.ids.len());
        for i in [1u64, 100, 200] {
            assert_eq!(
                d.claim(now, W, &i.to_string(), &t(999), |_| true),
                Claim::Duplicate
            );
        }
        // Past the window the floor and the marks are gone.
        let later = now + W + Duration::from_secs(1);
        assert_eq!(d.claim(later, W, "1", &t(1000), |_| true), Claim::Claimed);
    }

    #[test]
    fn ids_that_do_not_rise_turn_the_floor_off() {
        let now = Instant::now();
        let mut d = Dedup::new(now);
        for (n, i) in [5u64, 3].iter().enumerate() {
            assert_eq!(
                d.claim(now, W, &i.to_string(), &t(n as u64), |_| true),
                Claim::Claimed
            );
        }
        assert!(matches!(d.floor, Floor::Off));
        assert_eq!(numeric("007"), None);
        assert_eq!(numeric("1234567890123456"), None);
    }
}
