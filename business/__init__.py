"""rda.business: grouped scheduler, server and client runtimes, subscriptions, directory."""
