package cli

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fencesandbox/fence/api"
	"github.com/fencesandbox/fence/client"
)

// The identity verbs: teams (admin), API keys and access tokens. They act
// with the CLI's credential: the daemon's own key (the admin of the
// default team, who names another team with --team) or a team's access
// token (sk_e2b_…, sent as a Bearer token), which manages its own team's
// keys and tokens. A key's or token's value is printed once, when made.

func teamCmd() *cobra.Command {
	group := groupCmd("team", "Make and list teams, and read or set their limits (admin)")
	group.Aliases = []string{"teams"}
	group.Long = `Teams own sandboxes, snapshots, templates, secrets and audit records; each
team sees its own alone. The daemon's own key (FENCE_API_KEY) is the admin of
the default team and the only credential that makes teams.`
	group.AddCommand(teamCreateCmd(), teamListCmd(), teamLimitsCmd())
	return group
}

func teamCreateCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Make a team and print its ID",
		Example: `  team=$(fence team create acme)
  fence key create ci --team $team`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			t, err := c.CreateTeam(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.TeamID)
			return nil
		},
	}
	cf.add(cmd.Flags())
	return cmd
}

func teamListCmd() *cobra.Command {
	var (
		cf     clientFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the teams",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			teams, err := c.Teams(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), teams)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tCREATED")
			for _, t := range teams {
				fmt.Fprintf(tw, "%s\t%s\t%s\n", t.TeamID, t.Name, t.CreatedAt.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cf.add(cmd.Flags())
	return cmd
}

func teamLimitsCmd() *cobra.Command {
	var (
		cf  clientFlags
		set []string
	)
	cmd := &cobra.Command{
		Use:   "limits TEAM",
		Short: "Print a team's limits, or change some with --set",
		Long: `Print a team's limits as JSON. --set NAME=NUMBER (repeatable) changes the
named limits and keeps the others; the daemon refuses unknown names and
values out of range, and changes nothing then.`,
		Example: `  fence team limits $team
  fence team limits $team --set concurrentSandboxes=10 --set vcpus=16`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			changes, err := parsePairs("set", set)
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			limits, err := c.TeamLimits(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if len(changes) > 0 {
				names := make([]string, 0, len(changes))
				for k := range changes {
					names = append(names, k)
				}
				sort.Strings(names)
				for _, k := range names {
					n, err := strconv.ParseFloat(changes[k], 64)
					if err != nil {
						return usagef("--set %s=%s: not a number", k, changes[k])
					}
					limits[k] = n
				}
				if limits, err = c.SetTeamLimits(cmd.Context(), args[0], limits); err != nil {
					return err
				}
			}
			return printJSON(cmd.OutOrStdout(), limits)
		},
	}
	cmd.Flags().StringArrayVar(&set, "set", nil, "set a limit NAME=NUMBER (repeatable)")
	cf.add(cmd.Flags())
	return cmd
}

func keyCmd() *cobra.Command {
	group := groupCmd("key", "Make, list and revoke a team's API keys")
	group.Aliases = []string{"keys"}
	group.Long = `API keys (e2b_…) are what the E2B SDKs send (E2B_API_KEY): each acts for its
team. A key's value is printed once, when it is made; the daemon keeps only
its hash, and lists show a mask. A revoked key is refused from its next
request on, and its open streams end.

Without --team the keys are the CLI credential's own team's.`
	group.AddCommand(keyCreateCmd(), keyListCmd(), keyRevokeCmd())
	return group
}

func keyCreateCmd() *cobra.Command {
	var (
		cf     clientFlags
		team   string
		role   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Make an API key and print it (the only time it is shown)",
		Example: `  E2B_API_KEY=$(fence key create ci --team $team)
  fence key create laptop --json
  fence key create compliance --role auditor   # reads audit, usage, metrics, lists only`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			k, err := c.CreateAPIKeyWithRole(cmd.Context(), team, args[0], role)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), k)
			}
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			return nil
		},
	}
	cmd.Flags().StringVar(&team, "team", "", "the team's ID (admin only; default: the caller's team)")
	cmd.Flags().StringVar(&role, "role", "", `the key's role: "auditor" reads its team's audit trail, usage, metrics and lists and changes nothing (default: a full key)`)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (the key with its ID and mask)")
	cf.add(cmd.Flags())
	return cmd
}

func maskString(m api.IdentifierMask) string {
	return fmt.Sprintf("%s%s…%s", m.Prefix, m.MaskedValuePrefix, m.MaskedValueSuffix)
}

func keyListCmd() *cobra.Command {
	var (
		cf     clientFlags
		team   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List a team's API keys (masked)",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			keys, err := c.APIKeys(cmd.Context(), team)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), keys)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tKEY\tCREATED\tLAST USED")
			for _, k := range keys {
				used := "never"
				if k.LastUsed != nil {
					used = k.LastUsed.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.Name, maskString(k.Mask), k.CreatedAt.UTC().Format(time.RFC3339), used)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&team, "team", "", "the team's ID (admin only; default: the caller's team)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cf.add(cmd.Flags())
	return cmd
}

func keyRevokeCmd() *cobra.Command {
	var (
		cf   clientFlags
		team string
	)
	cmd := &cobra.Command{
		Use:     "revoke ID...",
		Short:   "Revoke API keys: refused from their next request on",
		Example: `  fence key revoke 3f0c9a8e-5d1b-4e7a-9c2f-0b6d8e4a1c7f --team $team`,
		Args:    minArgs(1),
		RunE:    cf.revokeEach(&team, (*client.Client).RevokeAPIKey),
	}
	cmd.Flags().StringVar(&team, "team", "", "the team's ID (admin only; default: the caller's team)")
	cf.add(cmd.Flags())
	return cmd
}

// revokeEach is the body of key and token revoke: revoke every ID given,
// stopping at the first failure.
func (f *clientFlags) revokeEach(team *string, revoke func(c *client.Client, ctx context.Context, team, id string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		c, err := f.client()
		if err != nil {
			return err
		}
		for _, id := range args {
			if err := revoke(c, cmd.Context(), *team, id); err != nil {
				return err
			}
		}
		return nil
	}
}

func tokenCmd() *cobra.Command {
	group := groupCmd("token", "Make, list and revoke a team's access tokens")
	group.Aliases = []string{"tokens"}
	group.Long = `Access tokens (sk_e2b_…, sent as Authorization: Bearer) manage their team's
API keys and access tokens; API keys cannot. Give one to a team's owner
(FENCE_API_KEY=sk_e2b_… fence key create …). A token's value is printed
once, when it is made.`
	group.AddCommand(tokenCreateCmd(), tokenListCmd(), tokenRevokeCmd())
	return group
}

func tokenCreateCmd() *cobra.Command {
	var (
		cf     clientFlags
		team   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "create NAME",
		Short:   "Make an access token and print it (the only time it is shown)",
		Example: `  fence token create owner --team $team`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			tok, err := c.CreateAccessToken(cmd.Context(), team, args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), tok)
			}
			fmt.Fprintln(cmd.OutOrStdout(), tok.Token)
			return nil
		},
	}
	cmd.Flags().StringVar(&team, "team", "", "the team's ID (admin only; default: the caller's team)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (the token with its ID and mask)")
	cf.add(cmd.Flags())
	return cmd
}

func tokenListCmd() *cobra.Command {
	var (
		cf     clientFlags
		team   string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List a team's access tokens (masked)",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			toks, err := c.AccessTokens(cmd.Context(), team)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), toks)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tTOKEN\tCREATED")
			for _, k := range toks {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.ID, k.Name, maskString(k.Mask), k.CreatedAt.UTC().Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVar(&team, "team", "", "the team's ID (admin only; default: the caller's team)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cf.add(cmd.Flags())
	return cmd
}

func tokenRevokeCmd() *cobra.Command {
	var (
		cf   clientFlags
		team string
	)
	cmd := &cobra.Command{
		Use:   "revoke ID...",
		Short: "Revoke access tokens",
		Args:  minArgs(1),
		RunE:  cf.revokeEach(&team, (*client.Client).RevokeAccessToken),
	}
	cmd.Flags().StringVar(&team, "team", "", "the team's ID (admin only; default: the caller's team)")
	cf.add(cmd.Flags())
	return cmd
}
