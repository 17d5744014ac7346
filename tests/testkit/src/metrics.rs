//! Reading an instance's `/metrics`.

/// The value of one series (its name and labels exactly as exposed, e.g.
/// `inlet_route_instances{route="r"}`) at the instance at `base`; `None` if the page
/// cannot be read or has no such series.
pub async fn series(http: &reqwest::Client, base: &str, series: &str) -> Option<f64> {
    let text = http.get(format!("{base}/metrics")).send().await.ok()?.text().await.ok()?;
    let prefix = format!("{series} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix)).and_then(|v| v.trim().parse().ok())
}

/// How many instances relay `route`, as the instance at `base` last read the route's
/// members (`inlet_route_instances`).
pub async fn route_instances(http: &reqwest::Client, base: &str, route: &str) -> Option<i64> {
    series(http, base, &format!("inlet_route_instances{{route=\"{route}\"}}")).await.map(|v| v as i64)
}
