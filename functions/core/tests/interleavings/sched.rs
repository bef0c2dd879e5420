//! A deterministic scheduler for operations that talk to the key-value
//! port: every KV operation is a yield point, and a controller decides which
//! operation performs its next KV call — or crashes there.
//!
//! Each operation runs on its own thread, but only one thread runs at a
//! time: a thread runs from one yield point to the next only when the
//! controller grants it a step, so a schedule is exactly the sequence of
//! choices the controller made, and replaying the same choices replays the
//! same execution. [`Chooser`]s pick the choices: [`Dfs`] enumerates every
//! schedule (stateless model checking with replay), [`Pct`] samples them
//! with random priorities and change points.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use metal_ipam_core::ports::kv::{KvError, KvStore, Swap};

/// What the controller lets a waiting thread do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Perform the KV operation it is waiting to perform.
    Step,
    /// Die before it: this and every later operation of the thread fail.
    Crash,
}

#[derive(Default)]
struct State {
    /// Threads that paused (a retry loop backing off) since their last
    /// step: they are not scheduled while another thread can run, which
    /// prunes the uninteresting schedules of a loop spinning against a
    /// stalled peer (its iterations differ only in attempt counters).
    yielded: Vec<bool>,
    waiting: Vec<bool>,
    done: Vec<bool>,
    crashed: Vec<bool>,
    grant: Option<(usize, Action)>,
}

/// The shared turnstile between the controller and the operation threads.
pub struct Turnstile {
    state: Mutex<State>,
    cv: Condvar,
}

impl Turnstile {
    fn new(n: usize) -> Arc<Self> {
        Arc::new(Turnstile {
            state: Mutex::new(State {
                yielded: vec![false; n],
                waiting: vec![false; n],
                done: vec![false; n],
                crashed: vec![false; n],
                grant: None,
            }),
            cv: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks thread `me` until the controller grants it a step; `false`
    /// when it must crash (now or earlier).
    fn yield_point(&self, me: usize) -> bool {
        let mut s = self.lock();
        if s.crashed[me] {
            return false;
        }
        s.waiting[me] = true;
        self.cv.notify_all();
        loop {
            if let Some((who, act)) = s.grant {
                if who == me {
                    s.grant = None;
                    s.waiting[me] = false;
                    s.yielded[me] = false;
                    if act == Action::Crash {
                        s.crashed[me] = true;
                        self.cv.notify_all();
                        return false;
                    }
                    return true;
                }
            }
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn mark_yield(&self, me: usize) {
        self.lock().yielded[me] = true;
    }

    fn finish(&self, me: usize) {
        let mut s = self.lock();
        s.done[me] = true;
        s.waiting[me] = false;
        self.cv.notify_all();
    }
}

thread_local! {
    static CURRENT: std::cell::RefCell<Option<(Arc<Turnstile>, usize)>> =
        const { std::cell::RefCell::new(None) };
}

/// Called by the checker's `Env::pause`: the calling operation thread is
/// backing off in a retry loop.
pub fn pause_here() {
    CURRENT.with(|c| {
        if let Some((t, me)) = c.borrow().as_ref() {
            t.mark_yield(*me);
        }
    });
}

/// A [`KvStore`] for one operation thread: yields to the controller before
/// every call.
pub struct SchedKv<'a, K: KvStore> {
    inner: &'a K,
    turn: Arc<Turnstile>,
    me: usize,
}

impl<K: KvStore> SchedKv<'_, K> {
    fn gate(&self) -> Result<(), KvError> {
        if self.turn.yield_point(self.me) {
            Ok(())
        } else {
            Err(KvError::Other("crashed (scheduled)".into()))
        }
    }
}

impl<K: KvStore> KvStore for SchedKv<'_, K> {
    type Cas = K::Cas;

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>, KvError> {
        self.gate()?;
        self.inner.get(key)
    }
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.gate()?;
        self.inner.get_many(keys)
    }
    fn set(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
        self.gate()?;
        self.inner.set(key, value)
    }
    fn delete(&self, key: &str) -> Result<(), KvError> {
        self.gate()?;
        self.inner.delete(key)
    }
    fn list_keys(&self) -> Result<Vec<String>, KvError> {
        self.gate()?;
        self.inner.list_keys()
    }
    fn increment(&self, key: &str, delta: i64) -> Result<i64, KvError> {
        self.gate()?;
        self.inner.increment(key, delta)
    }
    fn cas_read(&self, key: &str) -> Result<(Self::Cas, Option<Vec<u8>>), KvError> {
        self.gate()?;
        self.inner.cas_read(key)
    }
    fn cas_swap(&self, cas: Self::Cas, value: &[u8]) -> Result<Swap, KvError> {
        self.gate()?;
        self.inner.cas_swap(cas, value)
    }
}

/// Picks one of `options` choices at each decision point of a schedule.
pub trait Chooser {
    /// A choice in `0..options`.
    fn choose(&mut self, options: usize) -> usize;
}

/// How a schedule ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trace {
    /// Decision points taken.
    pub steps: usize,
    /// Whether some operation was crashed.
    pub crashed: bool,
}

/// Runs `ops` (each given its own scheduled store) under `chooser`, with at
/// most `crashes` crashes, and returns their results in order.
///
/// # Panics
/// When a schedule exceeds `max_steps` decisions (a livelock).
pub fn run<K, T, F>(
    kv: &K,
    ops: Vec<F>,
    chooser: &mut dyn Chooser,
    crashes: usize,
    max_steps: usize,
) -> (Vec<T>, Trace)
where
    K: KvStore + Sync,
    K::Cas: Send,
    T: Send,
    F: FnOnce(&SchedKv<'_, K>) -> T + Send,
{
    let n = ops.len();
    let turn = Turnstile::new(n);
    std::thread::scope(|scope| {
        let handles: Vec<_> = ops
            .into_iter()
            .enumerate()
            .map(|(me, op)| {
                let turn = turn.clone();
                scope.spawn(move || {
                    CURRENT.with(|c| *c.borrow_mut() = Some((turn.clone(), me)));
                    let kv = SchedKv {
                        inner: kv,
                        turn: turn.clone(),
                        me,
                    };
                    let out = op(&kv);
                    turn.finish(me);
                    out
                })
            })
            .collect();
        let mut crashes_left = crashes;
        let mut trace = Trace {
            steps: 0,
            crashed: false,
        };
        loop {
            let mut s = turn.lock();
            while s.grant.is_some() || (0..n).any(|i| !s.done[i] && !s.waiting[i]) {
                s = turn.cv.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            let waiting: Vec<usize> = (0..n).filter(|&i| s.waiting[i]).collect();
            let eager: Vec<usize> = waiting.iter().copied().filter(|&i| !s.yielded[i]).collect();
            let enabled = if eager.is_empty() { waiting } else { eager };
            if enabled.is_empty() {
                break;
            }
            let per = if crashes_left > 0 { 2 } else { 1 };
            let c = chooser.choose(enabled.len() * per);
            let who = enabled[c / per];
            let act = if c % per == 1 {
                crashes_left -= 1;
                trace.crashed = true;
                Action::Crash
            } else {
                Action::Step
            };
            trace.steps += 1;
            assert!(trace.steps <= max_steps, "livelock: {max_steps} steps");
            s.grant = Some((who, act));
            turn.cv.notify_all();
        }
        let results = handles
            .into_iter()
            .map(|h| h.join().expect("operation thread panicked"))
            .collect();
        (results, trace)
    })
}

/// Exhaustive depth-first enumeration of schedules by replay.
#[derive(Debug, Default)]
pub struct Dfs {
    /// (choice, options) of every decision of the current schedule.
    path: Vec<(usize, usize)>,
    pos: usize,
}

impl Dfs {
    /// Prepares the next schedule; `false` when every schedule was run.
    pub fn next_schedule(&mut self) -> bool {
        self.path.truncate(self.pos);
        while let Some((c, n)) = self.path.pop() {
            if c + 1 < n {
                self.path.push((c + 1, n));
                self.pos = 0;
                return true;
            }
        }
        false
    }

    /// Starts the first schedule.
    pub fn start(&mut self) {
        self.path.clear();
        self.pos = 0;
    }
}

impl Chooser for Dfs {
    fn choose(&mut self, options: usize) -> usize {
        let c = if self.pos < self.path.len() {
            let (c, n) = self.path[self.pos];
            assert_eq!(
                n, options,
                "replay diverged: the execution is not deterministic"
            );
            c
        } else {
            self.path.push((0, options));
            0
        };
        self.pos += 1;
        c
    }
}

/// Probabilistic concurrency testing: threads get random priorities, the
/// highest-priority enabled thread runs, and at `depth` random decision
/// points the running thread's priority drops below all others. Crash
/// choices are taken with a small probability.
pub struct Pct {
    rng: u64,
    change_points: Vec<usize>,
    step: usize,
    /// Priority of each choice slot seen so far (by position in the
    /// enabled list, which is stable: threads keep their index).
    bias: Vec<u64>,
}

impl Pct {
    /// A schedule drawn from `seed`, expecting about `length` decisions.
    pub fn new(seed: u64, depth: usize, length: usize) -> Self {
        let mut p = Pct {
            rng: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
            change_points: Vec::new(),
            step: 0,
            bias: Vec::new(),
        };
        for _ in 0..depth {
            let cp = (p.next() % length.max(1) as u64) as usize;
            p.change_points.push(cp);
        }
        p
    }

    fn next(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

impl Chooser for Pct {
    fn choose(&mut self, options: usize) -> usize {
        while self.bias.len() < options {
            let b = self.next();
            self.bias.push(b);
        }
        self.step += 1;
        // Crash slots are the odd ones when crashes are allowed; take one
        // rarely so most schedules run to completion.
        let pick = (0..options).max_by_key(|&i| self.bias[i]).unwrap_or(0);
        if self.change_points.contains(&self.step) {
            self.bias[pick] = 0;
        }
        if options > 1 && self.next().is_multiple_of(16) {
            return (self.next() % options as u64) as usize;
        }
        pick
    }
}

/// The checkers' environment, shared by every operation of a schedule: a
/// fixed clock, counter-based randomness (distinct tokens per call), and a
/// pause that tells the scheduler the thread is backing off.
#[derive(Default)]
pub struct SchedEnv(pub metal_ipam_core::testing::TestEnv);

impl metal_ipam_core::ports::Env for SchedEnv {
    fn now(&self) -> u64 {
        self.0.now()
    }
    fn random_u64(&self) -> u64 {
        self.0.random_u64()
    }
    fn pause(&self, attempt: u32) {
        // The first retries are explored in every order; from the third on
        // the thread is spinning against a stalled peer.
        if attempt >= 3 {
            pause_here();
        }
    }
    fn sleep_ms(&self, ms: u64) {
        self.0.sleep_ms(ms);
    }
}
