//! A request's keyed zones of one kind (limit_req's, limit_conn's), enforced ones apart from
//! those in dry run: each group is one slice, so one store call, and a shadow limit is asked on
//! its own so it can never change (or charge) an enforced decision.

use crate::store::{KeyedConn, KeyedZone};

/// A zone of one request that may be in dry run (`KeyedZone`, `KeyedConn`).
pub trait DryRun {
    fn dry_run(&self) -> bool;
}

impl DryRun for KeyedZone<'_> {
    fn dry_run(&self) -> bool {
        self.dry_run
    }
}

impl DryRun for KeyedConn<'_> {
    fn dry_run(&self) -> bool {
        self.dry_run
    }
}

/// A request's keyed zones of one kind, enforced ones first, then those in dry run.
pub struct Groups<T> {
    all: Vec<T>,
    enforced: usize,
}

impl<T: DryRun> Groups<T> {
    pub fn new(mut all: Vec<T>) -> Self {
        // Stable, so each group keeps the route's order (and no heap for a route's few zones).
        if !all.is_sorted_by_key(DryRun::dry_run) {
            all.sort_by_key(DryRun::dry_run);
        }
        let enforced = all.iter().take_while(|z| !z.dry_run()).count();
        Groups { all, enforced }
    }

    pub fn enforced(&self) -> &[T] {
        &self.all[..self.enforced]
    }

    pub fn shadow(&self) -> &[T] {
        &self.all[self.enforced..]
    }

    /// (group, dry run): enforced first.
    pub fn each(&self) -> [(&[T], bool); 2] {
        [(self.enforced(), false), (self.shadow(), true)]
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// Every zone: enforced ones in the route's order, then dry-run ones.
    pub fn all(&self) -> &[T] {
        &self.all
    }

    /// The zones themselves, in the order of `all`.
    pub fn into_all(self) -> Vec<T> {
        self.all
    }
}
