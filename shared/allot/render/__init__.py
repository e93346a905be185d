"""Text, SVG and HTML shared by the CLI, the simulator report and the dashboard."""
