//! Dividing one budget among its holders by their demand: the shares of a rate (Envoy RLQS
//! assignments, issue 50; rate leases) whose sum never exceeds the budget.
//!
//! Max-min fair with a floor: every holder first gets the floor (so a holder whose demand is not
//! known yet, or just rose, is not shut out for a whole report interval), then the rest is filled
//! like water: a holder asking for less than an even split gets what it asks, and what it leaves
//! is split among the others, until the budget is spent or every demand is met. A budget left
//! over when every demand is met is spread in proportion to demand (headroom for growth), so an
//! idle holder never holds back a busy one and the sum is always the whole budget.
//!
//! Pure: demand in, shares out. Integer parts (a token bucket's `max_tokens`) are divided with
//! [`divide_whole`], which keeps the sum within the budget and gives each holder at least one
//! where the budget allows.

/// Divides `budget` among holders with the given `demand` (same unit), each getting at least
/// `floor` (clamped so the floors never exceed the budget). The result sums to `budget` (within
/// float rounding) and is in the holders' order.
pub fn divide(budget: f64, demand: &[f64], floor: f64) -> Vec<f64> {
    let n = demand.len();
    if n == 0 || budget <= 0.0 {
        return vec![0.0; n];
    }
    let floor = floor.clamp(0.0, budget / n as f64);
    let mut share = vec![floor; n];
    let mut left = budget - floor * n as f64;
    // Water-filling over what each asks beyond its floor.
    let mut want: Vec<(usize, f64)> =
        demand.iter().enumerate().map(|(i, d)| (i, (d.max(0.0) - floor).max(0.0))).collect();
    want.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut remaining = n;
    for &(i, w) in &want {
        let even = left / remaining as f64;
        let given = w.min(even);
        share[i] += given;
        left -= given;
        remaining -= 1;
    }
    if left > 1e-12 {
        // Every demand met: the rest in proportion to demand, or evenly if nobody asked.
        let total: f64 = demand.iter().map(|d| d.max(0.0)).sum();
        for (i, d) in demand.iter().enumerate() {
            share[i] += if total > 0.0 { left * d.max(0.0) / total } else { left / n as f64 };
        }
    }
    share
}

/// Divides a whole number `budget` in proportion to `weights` (largest remainders), at least 1 each
/// while the budget has one for everybody. The sum is `budget`, or `n` when `budget < n` (each
/// holder needs one token to admit anything: the excess `n − budget` is stated by the caller's
/// bound).
pub fn divide_whole(budget: u64, weights: &[f64]) -> Vec<u64> {
    let n = weights.len() as u64;
    if n == 0 {
        return vec![];
    }
    if budget <= n {
        return vec![1; weights.len()];
    }
    let spare = budget - n;
    let total: f64 = weights.iter().map(|w| w.max(0.0)).sum();
    let exact: Vec<f64> = weights
        .iter()
        .map(|w| if total > 0.0 { spare as f64 * w.max(0.0) / total } else { spare as f64 / n as f64 })
        .collect();
    let mut parts: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let mut short = spare - parts.iter().sum::<u64>();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|&a, &b| (exact[b] - exact[b].floor()).total_cmp(&(exact[a] - exact[a].floor())));
    for &i in order.iter().cycle() {
        if short == 0 {
            break;
        }
        parts[i] += 1;
        short -= 1;
    }
    parts.iter().map(|p| p + 1).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(v: &[f64]) -> f64 {
        v.iter().sum()
    }

    #[test]
    fn small_demands_are_met_and_the_rest_goes_to_the_busy() {
        // 100/s among demands 5, 20, 200, floor 2: 5 and 20 are met, the busy one gets the rest.
        let s = divide(100.0, &[5.0, 20.0, 200.0], 2.0);
        assert!((s[0] - 5.0).abs() < 1e-9 && (s[1] - 20.0).abs() < 1e-9, "{s:?}");
        assert!((s[2] - 75.0).abs() < 1e-9, "{s:?}");
        assert!((sum(&s) - 100.0).abs() < 1e-9);
    }

    #[test]
    fn an_idle_holder_keeps_its_floor_only() {
        let s = divide(100.0, &[0.0, 300.0, 300.0], 1.0);
        assert!((s[0] - 1.0).abs() < 1e-9, "{s:?}");
        assert!((s[1] - 49.5).abs() < 1e-9 && (s[2] - 49.5).abs() < 1e-9, "{s:?}");
    }

    #[test]
    fn spare_budget_follows_demand() {
        let s = divide(100.0, &[10.0, 30.0], 0.0);
        assert!((s[0] - 25.0).abs() < 1e-9 && (s[1] - 75.0).abs() < 1e-9, "{s:?}");
        let nobody = divide(90.0, &[0.0, 0.0, 0.0], 0.0);
        assert!(nobody.iter().all(|x| (x - 30.0).abs() < 1e-9));
    }

    #[test]
    fn floors_never_exceed_the_budget() {
        let s = divide(3.0, &[100.0; 6], 1.0);
        assert!((sum(&s) - 3.0).abs() < 1e-9, "{s:?}");
        assert!(s.iter().all(|x| (x - 0.5).abs() < 1e-9));
    }

    #[test]
    fn whole_parts_sum_to_the_budget_with_one_each() {
        assert_eq!(divide_whole(10, &[1.0, 1.0, 8.0]), vec![2, 2, 6]);
        assert_eq!(divide_whole(2, &[1.0, 1.0, 1.0]), vec![1, 1, 1]);
        assert_eq!(divide_whole(7, &[0.0, 0.0]).iter().sum::<u64>(), 7);
        for budget in 3..200 {
            let parts = divide_whole(budget, &[0.3, 2.0, 0.0, 7.5]);
            assert_eq!(parts.iter().sum::<u64>(), budget.max(4));
            assert!(parts.iter().all(|&p| p >= 1));
        }
    }

    #[test]
    fn random_demands_never_pass_the_budget() {
        let mut x: u64 = 0x1234_5678;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let n = 1 + (x % 9) as usize;
            let demand: Vec<f64> = (0..n).map(|i| ((x >> (i * 5)) % 400) as f64).collect();
            let budget = (x % 1000) as f64 + 1.0;
            let s = divide(budget, &demand, budget / (10.0 * n as f64));
            assert!(sum(&s) <= budget + 1e-6, "{budget} {demand:?} -> {s:?}");
            assert!(s.iter().all(|&v| v >= 0.0));
            // Max-min: nobody whose demand is unmet gets less than someone else who got more than
            // their demand... except through the proportional spare (only when all are met).
            let unmet: Vec<usize> = (0..n).filter(|&i| s[i] + 1e-9 < demand[i]).collect();
            for &i in &unmet {
                for j in 0..n {
                    assert!(s[j] <= s[i] + 1e-6 || s[j] <= demand[j] + 1e-6, "{demand:?} -> {s:?}");
                }
            }
        }
    }
}
