"""Operating a device: backup, restore, doctor and repair, the card's wear, the A/B update
state and the history of the configuration file."""
