//! Reading an instance's `/metrics`.

/// The value of one series (its name and labels exactly as exposed, e.g.
/// `inlet_route_instances{route="r"}`) at the instance at `base`; `None` if the page
/// cannot be read or has no such series.
pub async fn series(http: &reqwest::Client, base: &str, series: &str) -> Option<f64> {
    let text = http.get(format!("{base}/metrics")).send().await.ok()?.text().await.ok()?;
    let prefix = format!("{series} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok())
}
