//! The references in docs/ that are rendered from a table in the code (the configuration keys,
//! the metrics): each lives between two marker lines of its page, and a test compares what is
//! there with what the table renders now, or, with `RETRYSAFE_BLESS=1`, writes it there.

/// The environment variable that makes the reference tests rewrite the pages instead of failing.
pub const BLESS: &str = "RETRYSAFE_BLESS";

/// Checks that the page `page` (relative to the repository) holds `rendered` between the
/// markers of `name`; with `RETRYSAFE_BLESS=1`, writes it there instead. `source` names the
/// table it comes from and `test` the test that renders it, for the marker line that tells a
/// reader not to edit the part by hand.
pub fn check_or_bless(page: &str, name: &str, source: &str, test: &str, rendered: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{page}: {error}"));
    let begin_prefix = format!("<!-- {name}: generated");
    let end = format!("<!-- end of {name} -->");
    let begin = format!(
        "{begin_prefix} from {source} by the test {test}; do not edit by hand: change {source} \
         and run `{BLESS}=1 cargo test --lib reference` -->"
    );
    let start = text
        .find(&begin_prefix)
        .unwrap_or_else(|| panic!("{page} has no line starting `{begin_prefix}`"));
    let stop = text[start..]
        .find(&end)
        .map(|at| start + at + end.len())
        .unwrap_or_else(|| panic!("{page} has no `{end}` after `{begin_prefix}`"));
    let wanted = format!("{begin}\n\n{rendered}\n{end}");
    if text[start..stop] == wanted {
        return;
    }
    if std::env::var(BLESS).as_deref() == Ok("1") {
        let rewritten = format!("{}{wanted}{}", &text[..start], &text[stop..]);
        std::fs::write(&path, rewritten).unwrap_or_else(|error| panic!("{page}: {error}"));
        return;
    }
    panic!(
        "{page}: the {name} is not what {source} renders; run `{BLESS}=1 cargo test --lib \
         reference` to rewrite it, and commit the page"
    );
}
