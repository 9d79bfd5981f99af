"""The leaderboard: results store, cross-model aggregation, and the Streamlit app."""
