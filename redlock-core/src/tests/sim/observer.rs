//! The observer: what the holders saw, on simulated time, and the invariants checked on
//! it, from outside the library (only what its public API reports).

use std::collections::BTreeMap;

use tokio::time::Instant;

/// One holding: from the moment the acquisition returned to the end of the validity the
/// holder last saw while it held (cut short by its release or crash).
#[derive(Clone, Debug)]
pub(super) struct Holding {
    pub(super) client: usize,
    pub(super) start: Instant,
    pub(super) end: Instant,
    pub(super) token: Option<u64>,
}

#[derive(Default)]
pub(super) struct Observer {
    /// Per lock (or semaphore), its holdings, and the permits it has (1 for a lock).
    holdings: BTreeMap<String, (u32, Vec<Holding>)>,
    /// Per fenced resource, the highest token it accepted.
    fenced: BTreeMap<String, u64>,
    pub(super) violations: Vec<String>,
    origin: Option<Instant>,
}

impl Observer {
    pub(super) fn new(origin: Instant) -> Self {
        Self {
            origin: Some(origin),
            ..Self::default()
        }
    }

    fn ms(&self, at: Instant) -> f64 {
        self.origin
            .map_or(0.0, |o| at.duration_since(o).as_secs_f64() * 1000.0)
    }

    /// `holding` of `name` (of `permits` permits) ended.
    pub(super) fn held(&mut self, name: &str, permits: u32, holding: Holding) {
        if holding.end > holding.start {
            let entry = self
                .holdings
                .entry(name.to_owned())
                .or_insert((permits, Vec::new()));
            entry.1.push(holding);
        }
    }

    /// A holder writes to the fenced resource `name` with `token`: accepted unless below
    /// a token accepted before.
    pub(super) fn fenced_write(&mut self, name: &str, client: usize, token: u64, at: Instant) {
        let at_ms = self.ms(at);
        let highest = self.fenced.entry(name.to_owned()).or_insert(0);
        if token < *highest {
            let line = format!(
                "{name}: c{client}'s write at {at_ms:.3} ms with token {token}, within its validity, refused: the resource had accepted {highest}",
                highest = *highest
            );
            self.violations.push(line);
        } else {
            *highest = token;
        }
    }

    /// `client`'s lock reported its loss at `at`, after its validity ended at `until`.
    pub(super) fn late_loss(&mut self, client: usize, at: Instant, until: Instant) {
        let line = format!(
            "c{client}'s loss reported at {:.3} ms, after its validity ended at {:.3} ms",
            self.ms(at),
            self.ms(until)
        );
        self.violations.push(line);
    }

    /// The invariants over every holding: no more holders at once than permits (no
    /// two holders of a lock within their validity), and tokens rising in the order the
    /// holdings began.
    pub(super) fn check(&mut self) {
        let mut found = Vec::new();
        for (name, (permits, holdings)) in &self.holdings {
            let mut edges: Vec<(Instant, i32, usize)> = Vec::new();
            for h in holdings {
                edges.push((h.start, 1, h.client));
                edges.push((h.end, -1, h.client));
            }
            // Ends before starts at the same instant: [start, end) intervals.
            edges.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)));
            let mut held = 0;
            for (at, delta, _) in &edges {
                held += delta;
                if held > i32::try_from(*permits).unwrap_or(i32::MAX) {
                    let at_ms = self.ms(*at);
                    let who: Vec<String> = holdings
                        .iter()
                        .filter(|h| h.start <= *at && *at < h.end)
                        .map(|h| {
                            format!(
                                "c{} [{:.3}, {:.3}) ms token {:?}",
                                h.client,
                                self.ms(h.start),
                                self.ms(h.end),
                                h.token
                            )
                        })
                        .collect();
                    found.push(format!(
                        "{name}: {held} holders within their validity at {at_ms:.3} ms (permits: {permits}): {}",
                        who.join("; ")
                    ));
                    break;
                }
            }
            if *permits == 1 {
                let mut by_start: Vec<&Holding> = holdings.iter().collect();
                by_start.sort_by_key(|h| h.start);
                for pair in by_start.windows(2) {
                    if let (Some(a), Some(b)) = (pair[0].token, pair[1].token)
                        && b <= a
                    {
                        found.push(format!(
                            "{name}: token {b} of c{} (from {:.3} ms) not above token {a} of c{} (from {:.3} ms)",
                            pair[1].client,
                            self.ms(pair[1].start),
                            pair[0].client,
                            self.ms(pair[0].start)
                        ));
                    }
                }
            }
        }
        self.violations.extend(found);
    }
}
