//! The options of `loopwarden serve`, which `loopwarden health` takes too.

use crate::config::Config;

/// Options of `loopwarden serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Config file (TOML). Defaults are built in; see config/loopwarden.toml.
    #[arg(long, env = "LOOPWARDEN_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// Address to listen on (overrides the config and LOOPWARDEN_LISTEN).
    #[arg(long)]
    pub listen: Option<String>,
    /// Database URL, e.g. sqlite://loopwarden.db (overrides the config and LOOPWARDEN_DB).
    #[arg(long)]
    pub db: Option<String>,
}

impl ServeArgs {
    /// The configuration these options name: defaults, the file, the environment, the flags.
    pub fn load_config(self) -> anyhow::Result<Config> {
        let config = Config::load(self.config.as_deref(), |var| std::env::var(var).ok())?;
        Ok(config.with_flags(self.listen, self.db)?)
    }

    /// The same configuration, for a command that reads it without serving
    /// (`crate::config::Purpose::ReadOnly`): a secret only serving uses may be unset.
    pub fn load_config_read_only(self) -> anyhow::Result<crate::config::Loaded> {
        let loaded = Config::load_for(
            self.config.as_deref(),
            |var| std::env::var(var).ok(),
            crate::config::Purpose::ReadOnly,
        )?;
        Ok(crate::config::Loaded {
            config: loaded.config.with_flags(self.listen, self.db)?,
            unset: loaded.unset,
        })
    }
}
