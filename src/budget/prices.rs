//! What tokens cost: the `[prices]` table, then the built-in list prices.
//!
//! A model's price is the first entry whose glob (`crate::glob::matches`) matches its name:
//! the user's entries in file order, then [`BUILT_IN`] in its order (more specific names
//! before the families that would also match them). A model nothing matches is not priced:
//! its answers cost 0 and say so (`priced = false`) rather than cost a guess.
//!
//! Only the standard rates are modelled: a provider's higher rate for long prompts (Gemini
//! Pro over 200k tokens, Claude Haiku 5.5 over 100k), batch and flex discounts, and
//! Anthropic's 1-hour cache writes (twice the 5-minute price's input multiple) are not. A
//! deployment that depends on them states its own prices.

use serde::de::{Deserializer, Error as _, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

use super::Usage;

/// US dollars per million tokens of each kind ([`Usage`]'s).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Price {
    pub input: f64,
    pub cached_input: f64,
    pub cache_write: f64,
    pub output: f64,
}

impl Price {
    /// What `usage` costs at this price, in dollars.
    pub fn cost(&self, usage: &Usage) -> f64 {
        (usage.input as f64 * self.input
            + usage.cached_input as f64 * self.cached_input
            + usage.cache_write as f64 * self.cache_write
            + usage.output as f64 * self.output)
            / 1_000_000.0
    }
}

/// One entry as the config states it: `input` and `output` are required; cache reads and
/// writes default to the input price (what they cost where the provider gives no discount).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceEntry {
    input: f64,
    output: f64,
    #[serde(default)]
    cached_input: Option<f64>,
    #[serde(default)]
    cache_write: Option<f64>,
}

impl PriceEntry {
    /// The price, or the first key (`input`...) whose amount is negative or not a number.
    fn price(self) -> Result<Price, &'static str> {
        let price = Price {
            input: self.input,
            cached_input: self.cached_input.unwrap_or(self.input),
            cache_write: self.cache_write.unwrap_or(self.input),
            output: self.output,
        };
        let amounts = [
            ("input", price.input),
            ("cached_input", price.cached_input),
            ("cache_write", price.cache_write),
            ("output", price.output),
        ];
        match amounts
            .iter()
            .find(|(_, amount)| !(amount.is_finite() && *amount >= 0.0))
        {
            Some((key, _)) => Err(key),
            None => Ok(price),
        }
    }
}

/// The `[prices]` table: model glob → [`Price`], in file order, tried before [`BUILT_IN`].
/// A negative amount is an error naming its key (`prices."gpt-5*".input`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices {
    entries: Vec<(String, Price)>,
}

impl Prices {
    /// The user's entries, in the order given, before the built-in ones.
    pub fn new(entries: Vec<(String, Price)>) -> Prices {
        Prices { entries }
    }

    /// The price of `model`: the first matching entry of the user's, then of the built-in.
    pub fn price(&self, model: &str) -> Option<Price> {
        let user = self.entries.iter().map(|(glob, p)| (glob.as_str(), *p));
        user.chain(BUILT_IN.iter().copied())
            .find(|(glob, _)| crate::glob::matches(glob, model))
            .map(|(_, price)| price)
    }

    /// What `usage` costs with `model`, in dollars; 0 for a model without a price.
    pub fn cost(&self, model: &str, usage: &Usage) -> f64 {
        self.price(model).map_or(0.0, |p| p.cost(usage))
    }
}

impl<'de> Deserialize<'de> for Prices {
    /// Read as a map visited in document order (TOML tables keep it), so that the user's
    /// first matching entry is the first in the file.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Prices, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = Prices;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(
                    "a table of model globs, each with input, output, cached_input, cache_write",
                )
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Prices, A::Error> {
                let mut entries = Vec::new();
                while let Some((glob, entry)) = map.next_entry::<String, PriceEntry>()? {
                    let price = entry.price().map_err(|key| {
                        A::Error::custom(format!(
                            "config key `prices.{glob:?}.{key}`: must be 0 or a positive amount (US dollars per million tokens)"
                        ))
                    })?;
                    entries.push((glob, price));
                }
                Ok(Prices { entries })
            }
        }
        d.deserialize_map(Entries)
    }
}

const fn price(input: f64, cached_input: f64, cache_write: f64, output: f64) -> Price {
    Price {
        input,
        cached_input,
        cache_write,
        output,
    }
}

/// OpenAI and Gemini bill no cache writes (their caching is implicit): their `cache_write`
/// is never used and is set to the input price.
const fn no_cache_writes(input: f64, cached_input: f64, output: f64) -> Price {
    price(input, cached_input, input, output)
}

/// List prices in US dollars per million tokens (standard tier, the lowest prompt-length
/// tier), read from the providers' pricing pages in November 2026: OpenAI
/// (developers.openai.com/api/docs/pricing), Anthropic (platform.claude.com, "Pricing";
/// cache writes at the 5-minute rate), Google (ai.google.dev/gemini-api/docs/pricing; the
/// Gemini 3 cache reads are a tenth of the input price, as the page lists them). The
/// `[prices]` table overrides them: its entries are tried first. Order matters: a name
/// before the family glob that would also match it.
pub const BUILT_IN: &[(&str, Price)] = &[
    // OpenAI.
    ("gpt-5.5-pro*", no_cache_writes(30.0, 30.0, 180.0)),
    ("gpt-5.5*", no_cache_writes(5.0, 0.5, 30.0)),
    ("gpt-5.4-pro*", no_cache_writes(30.0, 30.0, 180.0)),
    ("gpt-5.4-mini*", no_cache_writes(0.75, 0.075, 4.5)),
    ("gpt-5.4-nano*", no_cache_writes(0.2, 0.02, 1.25)),
    ("gpt-5.4*", no_cache_writes(2.5, 0.25, 15.0)),
    ("gpt-5.1-codex-mini*", no_cache_writes(0.25, 0.025, 2.0)),
    ("gpt-5.1*", no_cache_writes(1.25, 0.125, 10.0)),
    ("gpt-5-pro*", no_cache_writes(15.0, 15.0, 120.0)),
    ("gpt-5-mini*", no_cache_writes(0.25, 0.025, 2.0)),
    ("gpt-5-nano*", no_cache_writes(0.05, 0.005, 0.4)),
    ("gpt-5-codex*", no_cache_writes(1.25, 0.125, 10.0)),
    ("gpt-5", no_cache_writes(1.25, 0.125, 10.0)),
    ("gpt-5-20*", no_cache_writes(1.25, 0.125, 10.0)),
    ("gpt-4.1-mini*", no_cache_writes(0.4, 0.1, 1.6)),
    ("gpt-4.1-nano*", no_cache_writes(0.1, 0.025, 0.4)),
    ("gpt-4.1*", no_cache_writes(2.0, 0.5, 8.0)),
    ("gpt-4o-mini*", no_cache_writes(0.15, 0.075, 0.6)),
    ("gpt-4o*", no_cache_writes(2.5, 1.25, 10.0)),
    ("o4-mini*", no_cache_writes(1.1, 0.275, 4.4)),
    ("o3-mini*", no_cache_writes(1.1, 0.55, 4.4)),
    ("o3", no_cache_writes(2.0, 0.5, 8.0)),
    ("o3-20*", no_cache_writes(2.0, 0.5, 8.0)),
    // Anthropic: cache reads a tenth of the input price (a twentieth on Opus and Sonnet
    // 5.5), 5-minute cache writes 1.25 times it.
    ("claude-fable-5-1*", price(10.0, 0.25, 12.5, 50.0)),
    ("claude-fable-5*", price(10.0, 1.0, 12.5, 50.0)),
    ("claude-opus-5-5*", price(4.0, 0.2, 5.0, 20.0)),
    ("claude-opus-5*", price(5.0, 0.5, 6.25, 25.0)),
    ("claude-opus-4-5*", price(5.0, 0.5, 6.25, 25.0)),
    ("claude-opus-4-6*", price(5.0, 0.5, 6.25, 25.0)),
    ("claude-opus-4-7*", price(5.0, 0.5, 6.25, 25.0)),
    ("claude-opus-4-8*", price(5.0, 0.5, 6.25, 25.0)),
    ("claude-opus-4*", price(15.0, 1.5, 18.75, 75.0)),
    ("claude-sonnet-5-5*", price(2.0, 0.1, 2.5, 10.0)),
    ("claude-sonnet-5*", price(2.0, 0.2, 2.5, 10.0)),
    ("claude-sonnet-4*", price(3.0, 0.3, 3.75, 15.0)),
    ("claude-3-7-sonnet*", price(3.0, 0.3, 3.75, 15.0)),
    ("claude-haiku-5-5*", price(0.1, 0.01, 0.125, 0.5)),
    ("claude-haiku-4-5*", price(1.0, 0.1, 1.25, 5.0)),
    ("claude-3-5-haiku*", price(0.8, 0.08, 1.0, 4.0)),
    // Gemini (thinking is billed as output).
    ("gemini-3.8-flash*", no_cache_writes(0.75, 0.075, 3.75)),
    ("gemini-3.5-flash-lite*", no_cache_writes(0.3, 0.03, 2.5)),
    ("gemini-3.5-flash*", no_cache_writes(1.5, 0.15, 9.0)),
    ("gemini-3.1-pro*", no_cache_writes(2.0, 0.2, 12.0)),
    ("gemini-3.1-flash-lite*", no_cache_writes(0.25, 0.025, 1.5)),
    ("gemini-3-flash*", no_cache_writes(0.5, 0.05, 3.0)),
    ("gemini-2.5-pro*", no_cache_writes(1.25, 0.125, 10.0)),
    ("gemini-2.5-flash-lite*", no_cache_writes(0.1, 0.01, 0.4)),
    ("gemini-2.5-flash*", no_cache_writes(0.3, 0.03, 2.5)),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct File {
        prices: Prices,
    }

    fn parse(toml_text: &str) -> Result<Prices, String> {
        toml::from_str::<File>(toml_text)
            .map(|f| f.prices)
            .map_err(|e| e.to_string())
    }

    /// Every built-in entry is reachable: the name its glob spells (without the `*`)
    /// resolves to that entry, so no earlier, broader glob shadows it.
    #[test]
    fn no_built_in_price_is_shadowed_by_an_earlier_one() {
        let prices = Prices::default();
        for (i, (glob, price)) in BUILT_IN.iter().enumerate() {
            let name = glob.replace('*', "");
            let first = BUILT_IN
                .iter()
                .position(|(g, _)| crate::glob::matches(g, &name));
            assert_eq!(first, Some(i), "{glob} is shadowed");
            assert_eq!(prices.price(&name), Some(*price));
        }
    }

    #[test]
    fn the_models_the_clients_use_are_priced_by_their_family() {
        let prices = Prices::default();
        let opus = prices.price("claude-opus-5-5").unwrap();
        assert_eq!(
            (opus.input, opus.cached_input, opus.cache_write, opus.output),
            (4.0, 0.2, 5.0, 20.0)
        );
        assert_eq!(
            prices.price("claude-sonnet-4-5-20250929").unwrap().input,
            3.0
        );
        assert_eq!(prices.price("gpt-5.5").unwrap().output, 30.0);
        assert_eq!(prices.price("gpt-5.5-pro").unwrap().output, 180.0);
        assert_eq!(prices.price("gpt-4.1-mini-2025-04-14").unwrap().input, 0.4);
        assert_eq!(
            prices.price("gemini-3.8-flash").unwrap().cached_input,
            0.075
        );
        assert_eq!(prices.price("gemini-3.5-flash-lite").unwrap().input, 0.3);
        // Not guessed: a model nobody priced costs nothing, and says so.
        assert_eq!(prices.price("mock-model"), None);
        assert_eq!(
            prices.cost(
                "mock-model",
                &Usage {
                    input: 1_000_000,
                    ..Usage::default()
                }
            ),
            0.0
        );
    }

    #[test]
    fn cost_is_each_kind_of_token_at_its_own_price() {
        let usage = Usage {
            input: 1_000,
            cached_input: 10_000,
            cache_write: 2_000,
            output: 500,
        };
        // 1000×4 + 10000×0.2 + 2000×5 + 500×20 = 4000 + 2000 + 10000 + 10000 (per million).
        let cost = Prices::default().cost("claude-opus-5-5", &usage);
        assert!((cost - 0.026).abs() < 1e-12, "{cost}");
    }

    #[test]
    fn the_users_entries_come_first_in_file_order_and_fill_in_cache_prices() {
        let prices = parse(
            r#"[prices]
"gpt-5.5*" = { input = 1, output = 2 }
"gpt-*" = { input = 9, output = 9, cached_input = 0.5, cache_write = 0 }
"#,
        )
        .unwrap();
        // Before the built-in price, and before its own later, broader entry.
        assert_eq!(prices.price("gpt-5.5"), Some(price(1.0, 1.0, 1.0, 2.0)));
        assert_eq!(prices.price("gpt-4o"), Some(price(9.0, 0.5, 0.0, 9.0)));
        // The built-in list still prices what the user's entries do not match.
        assert_eq!(prices.price("claude-opus-5-5").unwrap().input, 4.0);
        // File order, not alphabetical order: "a*" sorts before "ab" but comes second.
        let prices =
            parse("[prices]\nab = { input = 1, output = 1 }\n\"a*\" = { input = 2, output = 2 }\n")
                .unwrap();
        assert_eq!(prices.price("ab").unwrap().input, 1.0);
    }

    #[test]
    fn a_negative_or_missing_price_is_an_error_naming_its_key() {
        let e = parse("[prices]\n\"my-model*\" = { input = 1, output = 2, cached_input = -0.1 }\n")
            .unwrap_err();
        assert!(e.contains(r#"prices."my-model*".cached_input"#), "{e}");
        let e = parse("[prices]\nm = { input = -1, output = 2 }\n").unwrap_err();
        assert!(e.contains(r#"prices."m".input"#), "{e}");
        let e = parse("[prices]\nm = { input = 1 }\n").unwrap_err();
        assert!(e.contains("output"), "{e}");
        let e = parse("[prices]\nm = { input = 1, output = 1, cache_read = 1 }\n").unwrap_err();
        assert!(e.contains("cache_read"), "{e}");
    }
}
