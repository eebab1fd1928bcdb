//! The connector's own account of where a queue message's time went (`/api/amqp10/stages`):
//! read before and after a run, and the difference printed as percentiles per stage, beside
//! the tool's own send → accepted and send → received times.

use std::collections::BTreeMap;
use std::net::ToSocketAddrs;

/// Each stage's histogram: bucket upper bound (ns) → count.
pub type Histograms = BTreeMap<String, BTreeMap<u64, u64>>;

/// The stages in a message's order, as the connector names them.
const ORDER: [&str; 4] = ["stored", "waited", "handed_out", "settled"];

/// Reads the histograms from the connector's HTTP endpoint at `base` (`http://host:port`).
pub async fn fetch(base: &str) -> Result<Histograms, String> {
    let host = base.trim_start_matches("http://").trim_end_matches('/');
    let addr = host
        .to_socket_addrs()
        .map_err(|e| format!("{host}: {e}"))?
        .next()
        .ok_or_else(|| format!("{host}: no address"))?;
    let reply = tokio::task::spawn_blocking(move || testkit::http_get(addr, "/api/amqp10/stages"))
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{host}: no answer"))?;
    if reply.status != 200 {
        return Err(format!("{host}: status {}", reply.status));
    }
    let json: serde_json::Value = serde_json::from_str(&reply.body).map_err(|e| e.to_string())?;
    let mut out = Histograms::new();
    for (stage, buckets) in json.as_object().ok_or("stages: not an object")? {
        let buckets = buckets.as_array().ok_or("stages: not a list")?;
        let counts = buckets
            .iter()
            .filter_map(|b| Some((b.get(0)?.as_u64()?, b.get(1)?.as_u64()?)))
            .collect();
        out.insert(stage.clone(), counts);
    }
    Ok(out)
}

/// The `p` quantile of a histogram: the upper bound of the bucket it falls in.
fn quantile(h: &BTreeMap<u64, u64>, p: f64) -> Option<u64> {
    let total: u64 = h.values().sum();
    let rank = (total as f64 * p).ceil().max(1.0) as u64;
    let mut seen = 0;
    h.iter().find_map(|(upper, n)| {
        seen += n;
        (seen >= rank).then_some(*upper)
    })
}

/// One line per stage: the percentiles of what was counted between `before` and `after`.
pub fn report(before: &Histograms, after: &Histograms) -> Vec<String> {
    ORDER
        .iter()
        .filter_map(|stage| {
            let a = after.get(*stage)?;
            let b = before.get(*stage);
            let delta: BTreeMap<u64, u64> = a
                .iter()
                .map(|(k, n)| (*k, n.saturating_sub(b.and_then(|b| b.get(k)).copied().unwrap_or(0))))
                .filter(|(_, n)| *n > 0)
                .collect();
            let count: u64 = delta.values().sum();
            let ms = |p| quantile(&delta, p).map_or(0.0, |ns| ns as f64 / 1e6);
            Some(format!(
                "connector {stage:<10} n {count:>7}  p50 < {:.3} ms  p99 < {:.3} ms  p999 < {:.3} ms",
                ms(0.5),
                ms(0.99),
                ms(0.999)
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The quantiles of a run are those of the buckets it added, read as their upper bounds.
    #[test]
    fn report_takes_the_difference() {
        let before: Histograms = [("stored".to_string(), [(1000, 5)].into())].into();
        let after: Histograms = [(
            "stored".to_string(),
            [(1000, 5), (2_000_000, 98), (8_000_000, 2)].into(),
        )]
        .into();
        let lines = report(&before, &after);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].contains("n     100"), "{}", lines[0]);
        assert!(lines[0].contains("p50 < 2.000 ms"), "{}", lines[0]);
        assert!(lines[0].contains("p999 < 8.000 ms"), "{}", lines[0]);
    }
}
