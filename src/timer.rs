//! The one timer of a replica: wait deadlines (`turn_wait`), settle cuts and flow
//! delays all go through it.
//!
//! One thread runs the jobs that fall due, one at a time, in deadline order (ties in
//! the order they were added). The queue itself ([`Queue`]) is a plain data structure
//! that takes the time as an argument, so its order is tested without sleeping.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

/// Work the timer runs when its deadline comes.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// Pending jobs by deadline.
#[derive(Default)]
pub(crate) struct Queue {
    heap: BinaryHeap<Reverse<Entry>>,
    /// Breaks ties between equal deadlines in favour of the job added first.
    seq: u64,
    /// Set once by `stop`: pending jobs are dropped, new ones refused.
    stopped: bool,
}

struct Entry {
    at: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

impl Queue {
    /// Adds a job; returns whether it is now the earliest (the thread must wake).
    pub(crate) fn push(&mut self, at: Instant, job: Job) -> bool {
        if self.stopped {
            return false;
        }
        self.seq += 1;
        let earliest = self.heap.peek().is_none_or(|Reverse(e)| at < e.at);
        self.heap.push(Reverse(Entry {
            at,
            seq: self.seq,
            job,
        }));
        earliest
    }

    /// The earliest job due at `now`, if any.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Job> {
        match self.heap.peek() {
            Some(Reverse(e)) if e.at <= now => self.heap.pop().map(|Reverse(e)| e.job),
            _ => None,
        }
    }

    /// When the earliest pending job is due.
    pub(crate) fn next_at(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse(e)| e.at)
    }

    /// Number of pending jobs.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

/// What the timer thread and its users share.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    /// Wakes the thread when an earlier job arrives or the timer stops.
    cv: Condvar,
}

/// The timer: a queue of jobs and, once started, the thread that runs them.
#[derive(Default)]
pub(crate) struct Timer {
    shared: Arc<Shared>,
    /// The thread, once started; taken by `stop`.
    thread: Mutex<Option<(JoinHandle<()>, ThreadId)>>,
}

impl Timer {
    /// Starts the thread (named `name`) unless it runs already.
    ///
    /// # Errors
    /// The OS refused a thread.
    pub(crate) fn start(&self, name: String) -> std::io::Result<()> {
        let mut thread = self.thread.lock();
        if thread.is_some() {
            return Ok(());
        }
        let shared = self.shared.clone();
        let handle = std::thread::Builder::new()
            .name(name)
            .spawn(move || run(&shared))?;
        let id = handle.thread().id();
        *thread = Some((handle, id));
        Ok(())
    }

    /// Runs `job` on the timer thread at `at` (at once if it is past). Dropped
    /// without running once the timer is stopped.
    pub(crate) fn at(&self, at: Instant, job: Job) {
        let earliest = self.shared.queue.lock().push(at, job);
        if earliest {
            self.shared.cv.notify_one();
        }
    }

    /// Stops the thread and drops the pending jobs; waits for a job that is running
    /// when `join` (unless called from a job, which would wait for itself).
    pub(crate) fn stop(&self, join: bool) {
        let pending = {
            let mut q = self.shared.queue.lock();
            q.stopped = true;
            std::mem::take(&mut q.heap)
        };
        self.shared.cv.notify_all();
        // Dropped outside the lock: a job's captures may run code on drop.
        drop(pending);
        let thread = self.thread.lock().take();
        if let Some((handle, id)) = thread
            && join
            && id != std::thread::current().id()
            && handle.join().is_err()
        {
            log::error!(target: "botmesh::timer", "the timer thread panicked");
        }
    }
}

fn run(shared: &Shared) {
    let mut q = shared.queue.lock();
    loop {
        if q.stopped {
            return;
        }
        if let Some(job) = q.pop_due(Instant::now()) {
            drop(q);
            job();
            q = shared.queue.lock();
            continue;
        }
        match q.next_at() {
            Some(at) => {
                shared.cv.wait_until(&mut q, at);
            }
            None => shared.cv.wait(&mut q),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn jobs_come_due_in_deadline_order_ties_first_come() {
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut q = Queue::default();
        let t0 = Instant::now();
        for (name, at) in [("c", 30), ("a", 10), ("b", 10), ("d", 40)] {
            let order = order.clone();
            q.push(
                t0 + Duration::from_millis(at),
                Box::new(move || order.lock().push(name)),
            );
        }
        assert!(q.pop_due(t0).is_none());
        while let Some(job) = q.pop_due(t0 + Duration::from_millis(30)) {
            job();
        }
        assert_eq!(*order.lock(), ["a", "b", "c"]);
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_at(), Some(t0 + Duration::from_millis(40)));
    }

    #[test]
    fn an_earlier_job_wakes_the_thread_a_later_one_does_not() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        assert!(q.push(t0 + Duration::from_secs(2), Box::new(|| ())));
        assert!(!q.push(t0 + Duration::from_secs(3), Box::new(|| ())));
        assert!(q.push(t0 + Duration::from_secs(1), Box::new(|| ())));
    }

    #[test]
    fn the_thread_runs_a_due_job_and_stop_drops_the_rest() {
        let timer = Timer::default();
        timer.start("botmesh-timer-test".into()).expect("spawn");
        let ran = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = crossbeam_channel::bounded(1);
        let r = ran.clone();
        timer.at(
            Instant::now(),
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(());
            }),
        );
        let never = ran.clone();
        timer.at(
            Instant::now() + Duration::from_secs(3600),
            Box::new(move || {
                never.fetch_add(100, Ordering::SeqCst);
            }),
        );
        rx.recv().expect("the due job ran");
        timer.stop(true);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        // Refused after stop.
        assert!(
            !timer
                .shared
                .queue
                .lock()
                .push(Instant::now(), Box::new(|| ()))
        );
    }
}
