package cli

import (
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

// The volume verbs: E2B's volumes (docs/VOLUMES.md), the team's of the
// CLI's credential.

func volumeCmd() *cobra.Command {
	group := groupCmd("volume", "Make, list and delete volumes (storage that outlives sandboxes)")
	group.Aliases = []string{"volumes"}
	group.Long = `A volume is a team's named, size-limited storage; sandboxes mount it by name
at create (E2B's volumeMounts) and share its files. The SDK's Volume class
reads and writes its files from outside.`
	group.AddCommand(volumeCreateCmd(), volumeListCmd(), volumeDeleteCmd())
	return group
}

func volumeCreateCmd() *cobra.Command {
	var (
		cf     clientFlags
		sizeMB int64
	)
	cmd := &cobra.Command{
		Use:     "create NAME",
		Short:   "Make a volume and print its ID",
		Example: `  fence volume create cache --size-mb 4096`,
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			v, err := c.CreateVolume(cmd.Context(), args[0], sizeMB)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), v.VolumeID)
			return nil
		},
	}
	cmd.Flags().Int64Var(&sizeMB, "size-mb", 0, "its size limit in MiB (default: the daemon's, 1 GiB)")
	cf.add(cmd.Flags())
	return cmd
}

func volumeListCmd() *cobra.Command {
	var (
		cf     clientFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the team's volumes",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			vols, err := c.Volumes(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), vols)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME")
			for _, v := range vols {
				fmt.Fprintf(tw, "%s\t%s\n", v.VolumeID, v.Name)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cf.add(cmd.Flags())
	return cmd
}

func volumeDeleteCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:     "delete ID",
		Aliases: []string{"rm"},
		Short:   "Delete a volume and its files (refused while a sandbox mounts it)",
		Args:    exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			return c.DeleteVolume(cmd.Context(), args[0])
		},
	}
	cf.add(cmd.Flags())
	return cmd
}
